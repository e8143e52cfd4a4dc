"""`tenplex store ls|mount` and store directories (`open_dir`, `write_back`).

In-process: loading a save and a checkpoint directory, write-back round trips, failed write-backs
(a leaf of the wrong dtype or shape, added or deleted, an I/O error halfway) that leave STORE
byte-identical with no temporary directory beside it, the one-line errors (exit 2), and an
import of the CLI that loads no FUSE. Marked `fuse` and `slow`: the command in a subprocess, read
by numpy from another process and ended by SIGTERM, SIGINT or an external unmount (unmounted,
exit 0), read-only and with --write-back (written back, or refused with exit 2 and STORE kept)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.frontends.spec import ptc_from_spec
from tenplex.runtime import checkpoint as serde
from tenplex.runtime.arrays import arange_tensors, materialize
from tenplex.runtime.checkpoint.directory import read_checkpoint, write_checkpoint
from tenplex.runtime.checkpoint.store_dir import StoreDirError, open_dir, write_back
from tenplex.runtime.fuse.store import fuse_unavailable_reason, is_mounted
from tests.mounts import start_mount

SPEC = "gpt-tiny:layers=1,hidden=64,heads=4,ffn=128,vocab=128,tp2@1x2"
W = np.arange(12, dtype=np.float32).reshape(3, 4)
REASON = fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mounting FUSE in tests needs root")


def fuse_test(test):
    """Marks a test that mounts (in a subprocess): `fuse`, `slow`, skipped without FUSE."""
    skip = pytest.mark.skipif(REASON is not None, reason=f"FUSE unavailable: {REASON}")
    return pytest.mark.fuse(pytest.mark.slow(skip(test)))


@pytest.fixture
def save_dir(tmp_path: Path) -> Path:
    state = {"model": {"w": W, "b": np.ones(3, ml_dtypes.bfloat16)}, "step": 7, "opt": [np.zeros(2)], "again": W}
    serde.save(state, tmp_path / "save")
    return tmp_path / "save"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    ptc = ptc_from_spec(SPEC)
    tensors = arange_tensors(ptc)
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}
    write_checkpoint(ptc, {st.id: materialize(ptc, tensors, st) for st in ptc.subtensors}, values, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _no_temp_dirs(root: Path) -> None:
    assert not [p.name for p in root.parent.iterdir() if p.name.startswith(f".{root.name}.")]


def _tenplex(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


# ---- store directories ------------------------------------------------------------------
def test_a_save_loads_at_its_file_paths(save_dir):
    sd = open_dir(save_dir)
    assert sd.kind == "save" and sd.store.walk() == ["/model/b", "/model/w", "/opt/0"]  # "again" is W's file
    assert sd.store.get("/model/b").dtype == ml_dtypes.bfloat16 and sd.tensors == 3
    np.testing.assert_array_equal(sd.store.get("/model/w"), W)


def test_a_checkpoint_loads_sub_tensors_and_values(ckpt):
    sd = open_dir(ckpt)
    ptc, arrays, values = read_checkpoint(ckpt)
    assert sd.kind == "checkpoint" and sd.tensors == len(ptc.subtensors)
    st = ptc.subtensors[0]
    leaf = f"/{ptc.partition_of[st.id]}/{st.path}"
    assert sd.store.get(leaf).tobytes() == arrays[st.id].tobytes()
    assert sd.store.get(f"/{ptc.partitions[0].id}/values") == values[ptc.partitions[0].id]


def test_write_back_of_a_save_records_new_shapes(save_dir):
    sd = open_dir(save_dir)
    sd.store.put("/model/w", np.full((2, 2), 5, np.float32), replace=True)
    write_back(sd)
    got = serde.load(save_dir)
    np.testing.assert_array_equal(got["model"]["w"], np.full((2, 2), 5, np.float32))
    assert got["step"] == 7 and got["model"]["b"].dtype == ml_dtypes.bfloat16
    _no_temp_dirs(save_dir)


def test_write_back_of_a_checkpoint(ckpt):
    sd = open_dir(ckpt)
    leaf = sd.store.walk()[0]
    new = np.asarray(sd.store.get(leaf)) + 1
    sd.store.put(leaf, new, replace=True)
    write_back(sd)
    assert open_dir(ckpt).store.get(leaf).tobytes() == new.tobytes()
    _no_temp_dirs(ckpt)


def _fail_halfway(monkeypatch):
    """One array file is written (by the writer of a save's or a checkpoint directory's files),
    then the disk is full."""
    from tenplex.runtime.checkpoint import directory, store_dir

    calls: list = []

    def full(save):
        def write(*args, **kwargs):
            calls.append(args)
            if len(calls) > 1:
                raise OSError(28, "No space left on device")
            return save(*args, **kwargs)

        return write

    monkeypatch.setattr(store_dir, "write_npy", full(store_dir.write_npy))
    monkeypatch.setattr(directory, "write_npy", full(directory.write_npy))


@pytest.mark.parametrize(
    "fixture, change, message",
    [
        (
            "save_dir",
            lambda s: s.put("/model/w", W.astype(np.float64), replace=True),
            "/model/w: holds float64, the save's float32",
        ),
        ("save_dir", lambda s: s.put("/extra", W), "/extra: not part of the save"),
        ("ckpt", lambda s: s.put(s.walk()[1], np.zeros(3, np.float32), replace=True), "array float32[3], expected"),
        ("ckpt", lambda s: s.delete(s.walk()[0]), "does not exist"),
        ("save_dir", "io", "No space left on device"),
        ("ckpt", "io", "No space left on device"),
    ],
    ids=["save-dtype", "save-extra", "ckpt-shape", "ckpt-deleted", "save-io", "ckpt-io"],
)
def test_a_failed_write_back_leaves_the_store_unchanged(request, monkeypatch, fixture, change, message):
    root = request.getfixturevalue(fixture)
    before = _files(root)
    sd = open_dir(root)
    _fail_halfway(monkeypatch) if change == "io" else change(sd.store)
    with pytest.raises(StoreDirError, match="write-back failed, left unchanged") as e:
        write_back(sd)
    assert message in str(e.value) and str(root.resolve()) in str(e.value)
    assert _files(root) == before
    _no_temp_dirs(root)


def test_ls_lists_paths_dtypes_shapes_and_bytes(save_dir):
    code, out, _ = _tenplex("store", "ls", str(save_dir))
    assert code == 0
    assert out.splitlines()[0] == f"{save_dir}: save, 3 tensors, 70 B"
    assert "/model/b  bfloat16  [3]         6" in out and "/model/w  float32   [3, 4]     48" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (("ls", "{tmp}/nope"), "{tmp}/nope: no such directory"),
        (("ls", "{tmp}"), "{tmp}: neither a tenplex save (state.json) nor a checkpoint directory (ptc.json)"),
        (("mount", "{save}", "{tmp}/nope"), "{tmp}/nope: no such directory"),
        (("mount", "{save}", "{save}/state.json"), "{save}/state.json: not a directory"),
        (("mount", "{save}", "/proc"), "/proc: already a mount point"),
        (("mount", "{tmp}/nope", "{tmp}"), "{tmp}/nope: no such directory"),
    ],
    ids=["ls-missing", "ls-not-a-store", "dir-missing", "dir-is-a-file", "dir-is-a-mount-point", "store-missing"],
)
def test_errors_are_one_line_naming_the_path(save_dir, tmp_path, args, message):
    names = {"tmp": tmp_path, "save": save_dir}
    code, _, err = _tenplex("store", *(a.format(**names) for a in args))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"tenplex: error: {message.format(**names)}")


def test_missing_fusermount3_is_an_error(save_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no fusermount3 on it
    code, _, err = _tenplex("store", "mount", str(save_dir), str(tmp_path))
    assert code == 2 and err.startswith(f"tenplex: error: {tmp_path}: cannot mount: ")
    assert "fusermount3 is missing" in err or "/dev/fuse is missing" in err


# ---- the command, mounted ---------------------------------------------------------------
def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """`tenplex store mount ...` in a subprocess; returns once it printed its 'mounted' line."""
    return start_mount("store", "mount", *args)


def _stop(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


# reads the bfloat16 leaf (its header names bfloat16: needs ml_dtypes), writes back its bits + 1 as <u2
RAW_PLUS_ONE = "import ml_dtypes\nnp.save(argv[0], np.load(argv[0]).view(np.uint16) + 1)"


def _numpy(code: str, *args: object) -> str:
    script = "import sys, numpy as np\nargv = sys.argv[1:]\n" + code
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@fuse_test
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_mount_serves_read_only_until_a_signal(save_dir, tmp_path, sig):
    before, mnt = _files(save_dir), tmp_path / "mnt"
    mnt.mkdir()
    proc, line = _start(str(save_dir), str(mnt))
    try:
        assert line.strip() == f"tenplex: mounted {save_dir} at {mnt}: 3 tensors, 70 B, read-only"
        got = _numpy("a = np.load(argv[0]); print(a.dtype, a.tolist())", mnt / "model/w.npy")
        assert got.strip() == f"float32 {W.tolist()}"
        _numpy(READ_ONLY, mnt / "model/w.npy")
    finally:
        code, _, err = _stop(proc, sig)
    assert code == 0, err
    assert not is_mounted(str(mnt)) and _files(save_dir) == before


READ_ONLY = """
import errno
try:
    np.save(argv[0], np.ones(2))
except OSError as e:
    assert e.errno == errno.EROFS, e
else:
    raise SystemExit("written to a read-only mount")
"""


def _first_array(root: Path) -> tuple[str, np.ndarray]:
    sd = open_dir(root)
    leaf = next(p for p in sd.store.walk() if sd.store.meta(p).kind == "array")
    return leaf, np.asarray(sd.store.get(leaf))


@fuse_test
def test_write_back_through_the_mount_after_an_external_unmount(ckpt, tmp_path):
    leaf, old = _first_array(ckpt)
    (mnt := tmp_path / "mnt").mkdir()
    proc, line = _start(str(ckpt), str(mnt), "--write-back")
    try:
        assert "read-write, written back on exit" in line
        _numpy(RAW_PLUS_ONE, f"{mnt}{leaf}.npy")  # bfloat16 rewritten as raw bits
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True, timeout=30)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == f"tenplex: wrote the store back to {ckpt}"
    _, new = _first_array(ckpt)
    assert new.dtype == old.dtype and (new.view(np.uint16) == old.view(np.uint16) + 1).all()
    _no_temp_dirs(ckpt)


@fuse_test
def test_a_failed_write_back_through_the_mount_keeps_the_old_state(ckpt, tmp_path):
    leaf, _ = _first_array(ckpt)
    before, mnt = _files(ckpt), tmp_path / "mnt"
    mnt.mkdir()
    proc, _ = _start(str(ckpt), str(mnt), "--write-back")
    try:
        _numpy("np.save(argv[0], np.zeros(3))", f"{mnt}{leaf}.npy")
    finally:
        code, _, err = _stop(proc, signal.SIGTERM)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"tenplex: error: {ckpt.resolve()}: write-back failed, left unchanged: ")
    assert not is_mounted(str(mnt)) and _files(ckpt) == before
    _no_temp_dirs(ckpt)


def test_importing_the_cli_loads_no_fuse_or_torch():
    code = "import sys, tenplex.cli.app; print(sorted(m for m in ('mfusepy', 'torch', 'tenplex.runtime.fuse.store') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


@fuse_test
def test_write_back_of_a_relative_store_writes_the_store_under_the_cwd(ckpt, tmp_path):
    """Issue 12 item 1: FUSE ran with cwd `/`, so a relative STORE was written back to `/STORE`."""
    name = f"tenplex-store-{os.getpid()}-{tmp_path.name}"  # nothing of that name may appear in /
    (cwd := tmp_path / "cwd").mkdir()
    ckpt.rename(cwd / name)
    leaf, old = _first_array(cwd / name)
    (cwd / "mnt").mkdir()
    proc, _ = start_mount("store", "mount", name, "mnt", "--write-back", cwd=cwd)
    try:
        _numpy(RAW_PLUS_ONE, f"{cwd / 'mnt'}{leaf}.npy")
    finally:
        code, out, err = _stop(proc, signal.SIGTERM)
        stray = [p for p in Path("/").iterdir() if name in p.name]
        for p in stray:
            shutil.rmtree(p, ignore_errors=True)
    assert code == 0, err
    assert not stray, f"written outside the store: {stray}"
    assert out.strip().endswith(f"tenplex: wrote the store back to {name}")
    _, new = _first_array(cwd / name)
    assert (new.view(np.uint16) == old.view(np.uint16) + 1).all()
    _no_temp_dirs(cwd / name)


def _npy_claiming(elements: int) -> bytes:
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
    return header.getvalue() + bytes(16)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.write_bytes(_npy_claiming(10**12)), "header claims float32[1000000000000] (4000000000000 bytes) but the file holds 16 bytes"),
        (lambda f: (f.unlink(), f.symlink_to("/dev/zero")), "not a regular file"),
        (lambda f: (f.unlink(), os.mkfifo(f)), "not a regular file"),
        (lambda f: f.write_bytes(b"\x93NUMPY\x01\x00\xff\xff{'descr'"), "not a readable .npy file"),
    ],
    ids=["header-1e12", "dev-zero", "fifo", "bad-header"],
)
def test_store_ls_of_a_lying_or_special_npy_is_one_line(save_dir, change, message):
    """Issue 12 item 8: a header claiming 10^12 elements gave MemoryError; a FIFO hung."""
    change(save_dir / "model" / "w.npy")
    code, _, err = _tenplex("store", "ls", str(save_dir))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"tenplex: error: {save_dir / 'model' / 'w.npy'}: ") and message in err, err


@pytest.mark.parametrize("file", ["../outside.npy", "/etc/hostname", "model/../../outside.npy", ""])
def test_a_save_naming_files_outside_itself_is_refused(save_dir, file):
    import json

    np.save(save_dir.parent / "outside.npy", W)
    text = (save_dir / "state.json").read_text()
    (save_dir / "state.json").write_text(text.replace('"model/w.npy"', json.dumps(file)))
    code, _, err = _tenplex("store", "ls", str(save_dir))
    assert code == 2 and err.count("\n") == 1 and f"file {file!r} is not a relative path inside the save" in err, err


def test_a_special_manifest_is_refused(save_dir):
    (save_dir / "state.json").unlink()
    (save_dir / "state.json").symlink_to("/dev/zero")
    code, _, err = _tenplex("store", "ls", str(save_dir))
    assert code == 2 and err == f"tenplex: error: {save_dir / 'state.json'}: is a character device, not a regular file (manifest)\n"
