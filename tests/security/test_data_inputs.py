"""Hostile dataset inputs (issue 12, items 8, 12 and 13): truncated or special index files, npz
members whose headers claim more than they hold, index entries that leave the dataset root, and
`tenplex dataset` numbers without bound. Each is one DataError line naming the file (or a usage
error naming the option), never a traceback, a hang or a file outside the root."""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from tenplex.data import DataError, DatasetIndex, SampleReader
from tenplex.data.index import FileEntry
from tests.data.helpers import npy_bytes
from tests.mounts import ROOT


@pytest.fixture
def dataset(tmp_path):
    """Three .npy samples under tmp/ds and their saved index tmp/ds.npz."""
    (tmp_path / "ds").mkdir()
    blobs = [npy_bytes(np.arange(i + 1)) for i in range(3)]
    parts = []
    for i, blob in enumerate(blobs):
        (tmp_path / "ds" / f"{i}.npy").write_bytes(blob)
        parts.append((f"{i}.npy", len(blob), [0], [len(blob)]))
    index = DatasetIndex.from_files("numpy", str(tmp_path / "ds"), parts)
    index.save(tmp_path / "ds.npz")
    return index, tmp_path / "ds.npz"


def _one_line(e: BaseException) -> str:
    assert "\n" not in str(e), str(e)
    return str(e)


def _tenplex(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tenplex.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


# ---- the index file ---------------------------------------------------------------------------
def test_a_truncated_index_is_one_line_naming_it(dataset, tmp_path):
    _, path = dataset
    data = path.read_bytes()
    for n in sorted({0, 10, 100, len(data) // 2, len(data) - 30, len(data) - 1}):
        (cut := tmp_path / f"cut{n}.npz").write_bytes(data[:n])
        with pytest.raises(DataError) as e:
            DatasetIndex.load(cut)
        assert _one_line(e.value).startswith(f"{cut}: cannot read a dataset index")


def test_a_corrupt_member_is_one_line(dataset, tmp_path):
    _, path = dataset
    data = bytearray(path.read_bytes())
    at = data.index(b"\x93NUMPY", data.index(b"file_id")) + 20  # inside file_id.npy's header
    data[at : at + 4] = b"\xff\xff\xff\xff"
    (bad := tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(DataError) as e:
        DatasetIndex.load(bad)
    assert _one_line(e.value).startswith(f"{bad}: ")


def test_a_member_header_claiming_1e12_elements_is_refused_before_allocating(dataset, tmp_path):
    _, path = dataset
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    members["offset.npy"] = header.getvalue() + bytes(64)
    with zipfile.ZipFile(bad := tmp_path / "huge.npz", "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    with pytest.raises(DataError) as e:
        DatasetIndex.load(bad)
    assert _one_line(e.value) == (f"{bad}: cannot read a dataset index: offset.npy: its header claims 8000000000000 "
                                  "bytes of data, the member holds 64")  # fmt: skip


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_an_index_that_is_no_regular_file_is_refused_at_once(tmp_path, target):
    if target == "fifo":
        os.mkfifo(target := str(tmp_path / "fifo"))
    (path := tmp_path / "i.npz").symlink_to(target)
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        DatasetIndex.load(path)
    assert time.monotonic() - start < 5
    assert _one_line(e.value) == f"{path}: cannot read a dataset index: not a regular file"


# ---- entries outside the root ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x", "a/../../x", "..", "a/.."])
def test_file_names_with_dotdot_components_are_refused(name):
    with pytest.raises(DataError, match=r"file name .* is not a non-empty relative '/'-separated path without '\.\.'"):
        FileEntry(name, 1)


def test_an_index_naming_a_file_outside_its_root_is_refused_on_load(tmp_path):
    (tmp_path / "root").mkdir()
    index = DatasetIndex.from_files("raw", str(tmp_path / "root"), [("x", 1, [0], [1])])
    index.save(tmp_path / "i.npz")
    with np.load(tmp_path / "i.npz") as z:  # a crafted meta: the fingerprint does not cover it
        arrays = {k: z[k] for k in z.files}
    meta = arrays["meta"].tobytes().replace(b'[["x", 1]]', b'[["../../../../../../../../etc/hostname", 1]]')
    np.savez(tmp_path / "bad.npz", **{**arrays, "meta": np.frombuffer(meta, np.uint8)})
    with pytest.raises(DataError) as e:
        DatasetIndex.load(tmp_path / "bad.npz")
    assert _one_line(e.value).startswith(f"{tmp_path / 'bad.npz'}: file name '../../")


def test_a_symlink_leaving_the_root_is_not_read(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_bytes(b"secret bytes")
    (tmp_path / "root" / "x").symlink_to(tmp_path / "secret")
    (tmp_path / "root" / "ok").write_bytes(b"ok")
    (tmp_path / "root" / "inner").symlink_to(tmp_path / "root" / "ok")  # inside the root: fine
    index = DatasetIndex.from_files("raw", str(tmp_path / "root"), [("x", 12, [0], [12]), ("inner", 2, [0], [2])])
    index.save(tmp_path / "i.npz")
    reader = SampleReader(DatasetIndex.load(tmp_path / "i.npz"))
    assert reader.read(1) == b"ok"
    with pytest.raises(DataError) as e:
        reader.read(0)
    assert _one_line(e.value) == (f"{tmp_path / 'i.npz'}: file 'x' resolves to {tmp_path / 'secret'}, outside the "
                                  f"index root {tmp_path / 'root'}")  # fmt: skip


# ---- tenplex dataset: bounded numbers, streamed output -----------------------------------------------
def test_order_streams_its_output(dataset):
    _, path = dataset
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tenplex.cli", "dataset", "order", str(path), "-G", "1",
                             "--seed", "0", "--schedule", "0:1", "--epochs", "1000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready and proc.stdout.readline().startswith('{"epoch": 0, "step": 0, "rank": 0')
    finally:
        proc.kill()
        proc.communicate()


def test_order_into_a_closed_pipe_exits_quietly(dataset):
    _, path = dataset
    r = subprocess.run(f"{sys.executable} -m tenplex.cli dataset order {path} -G 1 --seed 0 --schedule 0:1 "
                       "--epochs 100000 | head -1", shell=True, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert r.stdout.count("\n") == 1 and r.stderr == ""


BOUNDS = [
    pytest.param(("order", "{index}", "-G", "1", "--seed", "0", "--schedule", "0:1", "--epochs", "1e8"),
                 "'--epochs': '1e8' is not a valid integer", id="epochs-float"),
    pytest.param(("order", "{index}", "-G", "1", "--seed", "0", "--schedule", "0:1", "--epochs", "100000000"),
                 "'--epochs': 100000000 is not in the range 1<=x<=1000000", id="epochs-huge"),
    pytest.param(("order", "{index}", "-G", "2", "--seed", "0", "--schedule", "0:1000000000", "--uneven"),
                 "schedule: step 0: world: 1000000000 ranks are more than 65536", id="schedule-world"),
    pytest.param(("order", "{index}", "-G", "3", "--seed", "0", "--schedule", "0:10000000000000000000000", "--tail",
                  "partial"), "schedule: step 0: world: 10000000000000000000000 ranks are more than 65536",
                 id="schedule-world-huge"),
    pytest.param(("mount", "{index}", "{tmp}/none", "--rank", "0", "--world", "1000000000", "--seed", "0", "-G", "2"),
                 "'--world': 1000000000 is not in the range 1<=x<=65536", id="mount-world"),
    pytest.param(("mount", "{index}", "{tmp}/none", "--rank", "0", "--world", "1", "--seed", "0", "-G", "1", "--steps",
                  str(10**18)), "'--steps': 1000000000000000000 is not in the range 0<=x<=1000000", id="mount-steps"),
    pytest.param(("mount", "{index}", "{tmp}/none", "--rank", "0", "--world", "1", "--seed", "0", "-G", "1"),
                 "{tmp}/none: no such directory", id="mount-dir-missing"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BOUNDS)
def test_numbers_are_bounded_with_one_line(dataset, tmp_path, args, message):
    _, path = dataset
    fill = {"index": str(path), "tmp": str(tmp_path)}
    r = _tenplex("dataset", *(a.format(**fill) for a in args))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("tenplex: error: ") and message.format(**fill) in r.stderr, r.stderr


def test_a_huge_global_batch_not_divided_names_no_divisor_list(dataset):
    from tenplex.data.partition import check_world

    start = time.monotonic()
    with pytest.raises(DataError, match="world: 7 ranks do not divide global batch 1000000000000000000000"):
        check_world(10**21, 7)
    assert time.monotonic() - start < 1


# ---- special files among the dataset's own files and the state ----------------------------------------
def test_indexing_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "x.npy")
    r = _tenplex("dataset", "index", str(tmp_path / "x.npy"), "-o", str(tmp_path / "i.npz"), timeout=20)
    assert r.returncode == 2 and r.stderr == f"tenplex: error: {tmp_path / 'x.npy'}: cannot open: not a regular file\n"
    assert not (tmp_path / "i.npz").exists()


def test_a_sample_file_replaced_by_a_fifo_is_refused_at_once(dataset, tmp_path):
    index, _ = dataset
    (tmp_path / "ds" / "0.npy").unlink()
    os.mkfifo(tmp_path / "ds" / "0.npy")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'ds' / '0.npy'}: cannot open: not a regular file")):
        SampleReader(index).read(0)


@pytest.mark.parametrize("content", [b"\xff", "/dev/zero"], ids=["non-utf8", "dev-zero"])
def test_a_bad_state_file_is_one_line(dataset, tmp_path, content):
    _, path = dataset
    state = tmp_path / "state.json"
    state.symlink_to(content) if isinstance(content, str) else state.write_bytes(content)
    r = _tenplex("dataset", "order", str(path), "-G", "1", "--seed", "0", "--schedule", "0:1", "--state", str(state))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"tenplex: error: {state}: ")
