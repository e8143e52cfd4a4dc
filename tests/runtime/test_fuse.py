"""FUSE view: listing, numpy.load (plain and mmap) per dtype, a large array read in chunks, JSON
values, writes through the mount, malformed writes, deletes and renames, read-only mounts, the
page cache kept across opens (and dropped after a rewrite), the tuned read-ahead, `load_npy`
(O_DIRECT), and the splice segments of a read against `read` byte for byte. Every test mounts a
real store at a tmp_path and unmounts it in teardown; the module skips without FUSE.

numpy's own file I/O on the mount runs in a child process (`_child`): in the serving process it
would hold the GIL that the FUSE thread needs (see `mount`). Python file I/O is safe in-process."""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tenplex.runtime.fuse import splice
from tenplex.runtime.fuse.store import (
    DTYPE_XATTR,
    READ_AHEAD_KB,
    NpyFile,
    load_npy,
    mount,
    parse_npy,
    read_ahead_of,
)
from tenplex.runtime.fuse.store import fuse_unavailable_reason as _reason
from tenplex.runtime.store.tree import TensorStore

REASON = _reason()
if os.geteuid() != 0 and REASON is None:
    REASON = "mounting FUSE in tests needs root"
pytestmark = [pytest.mark.fuse, pytest.mark.skipif(REASON is not None, reason=f"FUSE unavailable: {REASON}")]

P = "/job/j/t/0"
ARRAYS = {
    "w_f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "w_bf16": (np.arange(10) % 7).astype(ml_dtypes.bfloat16).reshape(2, 5),
    "mask": np.arange(9).reshape(3, 3) % 2 == 0,
    "ids": np.arange(-5, 5, dtype=np.int64),
    "scalar": np.array(3.5, dtype=np.float64),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
}


@pytest.fixture
def store():
    s = TensorStore()
    for name, a in ARRAYS.items():
        s.put(f"{P}/{name}", a)
    s.put(f"{P}/step", 7)
    s.put(f"{P}/cfg/opt", {"lr": 0.1, "betas": [0.9, 0.95], "name": "adam"})
    yield s
    s.close()


@pytest.fixture
def mnt(store, tmp_path):
    d = tmp_path / "mnt"
    d.mkdir()
    with mount(store, str(d)) as m:
        yield m
    assert not os.path.ismount(d)


def _child(code: str, *args: object) -> None:
    """Run `code` in a fresh Python with `numpy as np` imported and `args` in `argv`."""
    script = "import sys, numpy as np\nargv = sys.argv[1:]\n" + code
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _load(path: str) -> np.ndarray:
    return np.load(io.BytesIO(Path(path).read_bytes()))


def _expected(name: str) -> np.ndarray:
    return ARRAYS[name]


def test_listing_mirrors_the_store(mnt):
    assert sorted(os.listdir(mnt)) == ["job"]
    assert sorted(os.listdir(f"{mnt}{P}")) == sorted([f"{n}.npy" for n in ARRAYS] + ["step.json", "cfg"])
    assert os.listdir(f"{mnt}{P}/cfg") == ["opt.json"]
    assert os.path.isdir(f"{mnt}{P}/cfg") and os.path.isfile(f"{mnt}{P}/step.json")


def test_numpy_load_equals_the_stored_array(mnt, tmp_path):
    copy = """
import ml_dtypes  # the bfloat16 leaf's header names bfloat16
for name in argv[2:]:
    for mode in (None, "r"):
        a = np.load(f"{argv[0]}/{name}.npy", mmap_mode=mode)
        open(f"{argv[1]}/{name}-{mode}.dtype", "w").write(a.dtype.name)
        np.save(f"{argv[1]}/{name}-{mode}.npy", a.view(np.uint16) if a.dtype.name == "bfloat16" else a)
"""
    _child(copy, f"{mnt}{P}", tmp_path, *ARRAYS)
    for name in ARRAYS:
        want = _expected(name)
        assert os.path.getsize(f"{mnt}{P}/{name}.npy") == len(_npy_bytes(ARRAYS[name]))
        for mode in (None, "r"):
            got = np.load(tmp_path / f"{name}-{mode}.npy")
            assert (tmp_path / f"{name}-{mode}.dtype").read_text() == want.dtype.name, (name, mode)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (name, mode)


def _npy_bytes(a: np.ndarray) -> bytes:
    f = NpyFile.from_leaf(a)
    return f.read(f.size, 0)


def test_files_are_byte_identical_to_np_save(store, mnt, tmp_path):
    store.put("/f", np.asfortranarray(ARRAYS["w_f32"]), copy=False)  # served with fortran_order
    for name in (f"{P}/w_f32", f"{P}/scalar", "/f"):
        np.save(tmp_path / "ref.npy", store.get(name))
        with open(f"{mnt}{name}.npy", "rb") as f:
            assert f.read() == (tmp_path / "ref.npy").read_bytes()


def test_bfloat16_header_names_its_dtype_with_a_dtype_xattr(mnt):
    """Issue 13 item 13: the file was raw <u2 bits, which np.load returned as uint16 silently."""
    path = f"{mnt}{P}/w_bf16.npy"
    assert os.getxattr(path, DTYPE_XATTR) == b"bfloat16"
    assert b"'descr': 'bfloat16'" in Path(path).read_bytes()[:128]
    got = _load(path)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, ARRAYS["w_bf16"])
    script = "import sys, numpy as np\ntry:\n    np.load(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
    r = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "'bfloat16'" in r.stdout, r.stdout + r.stderr  # refused, never uint16


def test_strided_view_is_served_in_c_order(store, tmp_path):
    base = np.arange(64, dtype=np.int16).reshape(8, 8)
    store.put("/s", base[::2, 1::3], copy=False)
    (tmp_path / "m").mkdir()
    with mount(store, str(tmp_path / "m")) as m:
        np.testing.assert_array_equal(_load(f"{m}/s.npy"), base[::2, 1::3])


def test_large_array_read_in_chunks(store, tmp_path):
    big = np.arange(16 * 2**20, dtype=np.float32)  # 64 MiB
    store.put("/big", big, copy=False)
    (tmp_path / "m").mkdir()
    with mount(store, str(tmp_path / "m")) as m:
        with open(f"{m}/big.npy", "rb") as f:
            f.seek(len(NpyFile.from_leaf(big).header))
            for start in range(0, big.size, 2**20):
                assert np.array_equal(np.frombuffer(f.read(4 * 2**20), np.float32), big[start : start + 2**20]), start
        check = """
want = np.arange(16 * 2**20, dtype=np.float32)
for mode in ("r", None):
    got = np.load(argv[0], mmap_mode=mode)
    for start in range(0, want.size, 2**21):
        assert np.array_equal(got[start : start + 2**21], want[start : start + 2**21]), (mode, start)
"""
        _child(check, f"{m}/big.npy")


def test_large_replies_spliced_into_o_direct_reads(store, tmp_path):
    """Replies of a full request (`splice.MAX_READ`) from C-, F-contiguous and strided leaves
    whose bytes start off a page boundary, read with O_DIRECT into unaligned and aligned arrays."""
    base = np.arange(3 * 2**20 + 7, dtype=np.float32)
    leaves = {"c": base[1:], "f": np.asfortranarray(base[: 3 * 2**20].reshape(1024, -1)), "s": base[::3]}
    for name, leaf in leaves.items():
        store.put(f"/{name}", leaf, copy=False)
    (tmp_path / "m").mkdir()
    with mount(store, str(tmp_path / "m")) as m:
        for name, leaf in leaves.items():
            np.testing.assert_array_equal(load_npy(f"{m}/{name}.npy"), leaf)
            with open(os.open(f"{m}/{name}.npy", os.O_RDONLY | os.O_DIRECT), "rb", buffering=0) as f:
                data = f.read()  # one read of the whole file: several requests in flight
            assert data == NpyFile.from_leaf(leaf).read(10**9, 0), name


def test_values_are_json_files(mnt):
    with open(f"{mnt}{P}/step.json") as f:
        assert json.load(f) == 7
    with open(f"{mnt}{P}/cfg/opt.json") as f:
        assert json.load(f) == {"lr": 0.1, "betas": [0.9, 0.95], "name": "adam"}


def test_np_save_through_the_mount_stores_the_array(store, mnt):
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    os.mkdir(f"{mnt}{P}/new")
    assert os.listdir(f"{mnt}{P}/new") == []
    save = """
np.save(argv[0], np.arange(24, dtype=np.float16).reshape(2, 3, 4))
np.save(argv[1], np.asfortranarray(np.ones((3, 2), np.int8)))
"""
    _child(save, f"{mnt}{P}/new/x.npy", f"{mnt}{P}/ids.npy")  # a new file and an overwrite
    assert store.get(f"{P}/new/x").dtype == np.float16
    np.testing.assert_array_equal(store.get(f"{P}/new/x"), a)
    np.testing.assert_array_equal(_load(f"{mnt}{P}/new/x.npy"), a)
    np.testing.assert_array_equal(store.get(f"{P}/ids"), np.ones((3, 2), np.int8))


@pytest.mark.parametrize(
    "code",
    [
        "np.save(argv[0], np.load(argv[0]).view(np.uint16))",  # raw <u2 bits, as older versions served
        "np.save(argv[0], np.load(argv[0]) + 0)",  # np.save of an ml_dtypes array: an opaque |V2
        "from tenplex.runtime.checkpoint.npy import write_npy\na = np.load(argv[0])\nwrite_npy(open(argv[0], 'wb'), a)",
    ],
    ids=["raw-bits", "np.save", "named"],
)
def test_bfloat16_written_over_bfloat16_keeps_the_dtype(store, mnt, code):
    _child("import ml_dtypes\n" + code, f"{mnt}{P}/w_bf16.npy")  # read-modify-write
    assert store.get(f"{P}/w_bf16").dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(store.get(f"{P}/w_bf16"), ARRAYS["w_bf16"])


def test_a_named_bfloat16_npy_makes_a_new_bfloat16_leaf(store, mnt):
    code = "import ml_dtypes\nfrom tenplex.runtime.checkpoint.npy import write_npy\n"
    code += "write_npy(open(argv[0], 'wb'), np.arange(4, dtype=ml_dtypes.bfloat16))"
    _child(code, f"{mnt}{P}/new_bf16.npy")
    assert store.get(f"{P}/new_bf16").dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(store.get(f"{P}/new_bf16"), np.arange(4, dtype=ml_dtypes.bfloat16))


def test_json_written_through_the_mount_is_stored(store, mnt):
    with open(f"{mnt}{P}/epoch.json", "w") as f:
        json.dump({"epoch": 3}, f)
    assert store.get(f"{P}/epoch") == {"epoch": 3}


@pytest.mark.parametrize("content", [b"", b"not a npy file", _npy_bytes(np.zeros(4, np.float32))[:-3]])
def test_malformed_write_stores_nothing(store, mnt, content):
    with pytest.raises(OSError) as e, open(f"{mnt}{P}/bad.npy", "wb") as f:
        f.write(content)
    assert e.value.errno == errno.EINVAL
    assert not store.exists(f"{P}/bad")
    assert "bad.npy" not in os.listdir(f"{mnt}{P}")


def test_other_file_names_cannot_be_created(mnt):
    with pytest.raises(PermissionError):
        open(f"{mnt}{P}/notes.txt", "w").close()


def test_missing_file_raises_file_not_found(mnt):
    with pytest.raises(FileNotFoundError):
        Path(f"{mnt}{P}/nope.npy").read_bytes()
    with pytest.raises(FileNotFoundError):
        Path(f"{mnt}{P}/step.npy").read_bytes()  # a value is only step.json
    with pytest.raises(FileNotFoundError):
        os.listdir(f"{mnt}/job/other")


def test_delete_and_rename_map_to_the_store(store, mnt):
    os.unlink(f"{mnt}{P}/ids.npy")
    assert not store.exists(f"{P}/ids")
    os.rename(f"{mnt}{P}/mask.npy", f"{mnt}{P}/mask2.npy")
    np.testing.assert_array_equal(store.get(f"{P}/mask2"), ARRAYS["mask"])
    with pytest.raises(OSError) as e:
        os.rmdir(f"{mnt}{P}/cfg")
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(f"{mnt}{P}/cfg/opt.json")
    os.rmdir(f"{mnt}{P}/cfg")
    assert not store.exists(f"{P}/cfg")


def test_parse_npy_rejects_object_arrays():
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    with pytest.raises(ValueError, match="object arrays"):
        parse_npy(f.getvalue() + bytes(8))


@pytest.mark.parametrize(
    "leaf",
    [ARRAYS["w_f32"], ARRAYS["fortran"], ARRAYS["scalar"], np.arange(64, dtype=np.int16).reshape(8, 8)[::2, 1::3],
     np.zeros((0, 3), np.float32), {"lr": 0.1}],
    ids=["c", "fortran", "0-d", "strided", "empty", "value"],
)  # fmt: skip
def test_segments_serve_the_bytes_of_read(leaf):
    f = NpyFile.from_leaf(leaf)
    for offset in range(0, f.size + 2, 7):
        for size in (1, 5, 64, f.size + 10):
            buf = ctypes.create_string_buffer(size)
            n = splice.copy_into(ctypes.addressof(buf), f.segments(size, offset))
            assert buf.raw[:n] == f.read(size, offset), (offset, size)


def test_read_only_mount_refuses_changes(store, tmp_path):
    (tmp_path / "m").mkdir()
    with mount(store, str(tmp_path / "m"), read_only=True) as m:
        np.testing.assert_array_equal(_load(f"{m}{P}/ids.npy"), ARRAYS["ids"])
        changes = [
            lambda: Path(f"{m}{P}/ids.npy").write_bytes(b""),
            lambda: Path(f"{m}{P}/new.json").write_text("1"),
            lambda: os.unlink(f"{m}{P}/ids.npy"),
            lambda: os.mkdir(f"{m}{P}/d"),
            lambda: os.rename(f"{m}{P}/ids.npy", f"{m}{P}/x.npy"),
        ]
        for i, change in enumerate(changes):
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS, i
    assert store.walk() == sorted(f"{P}/{n}" for n in [*ARRAYS, "step", "cfg/opt"])


def test_kept_pages_are_dropped_after_a_rewrite(store, tmp_path):
    store.put("/a", np.zeros(4096, np.float32))
    (tmp_path / "m").mkdir()
    read = "print(np.load(argv[0]).sum())"
    with mount(store, str(tmp_path / "m"), keep_cache=True) as m:
        assert _child_out(read, f"{m}/a.npy") == "0.0"  # now cached
        Path(f"{m}/a.npy").write_bytes(_npy_bytes(np.ones(4096, np.float32)))  # same size, new bytes
        assert _child_out(read, f"{m}/a.npy") == "4096.0"
        assert _child_out(read, f"{m}/a.npy") == "4096.0"


def _child_out(code: str, *args: object) -> str:
    script = "import sys, numpy as np\nargv = sys.argv[1:]\n" + code
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_mount_raises_the_read_ahead(mnt):
    assert read_ahead_of(mnt) == READ_AHEAD_KB


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_load_npy_equals_numpy_load(mnt, tmp_path, name):
    got = load_npy(f"{mnt}{P}/{name}.npy")  # O_DIRECT through FUSE (Python I/O: safe in-process)
    want = _expected(name)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    (tmp_path / "x.npy").write_bytes(_npy_bytes(want))
    np.testing.assert_array_equal(load_npy(tmp_path / "x.npy"), want)  # O_DIRECT or its fallback


def test_load_npy_rejects_a_truncated_file(tmp_path):
    shm = tempfile.mkdtemp(dir="/dev/shm") if os.path.isdir("/dev/shm") else tmp_path  # tmpfs: O_DIRECT
    try:
        Path(shm, "t.npy").write_bytes(_npy_bytes(np.zeros(4, np.float32))[:-3])
        with pytest.raises(ValueError, match="data bytes|could only read"):  # O_DIRECT or numpy.load
            load_npy(Path(shm, "t.npy"))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
