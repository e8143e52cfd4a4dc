"""The kernel-protocol FUSE session (`fuse.session`) and `.npy` images (`store.image`): the byte
layouts of the protocol, node ids and listings, the passthrough policy, images byte-identical to
`np.save`, and a real read-only store mount served without libfuse: image leaves passed through
(no READ reaches the server, `mmap` shares the store's pages), other leaves read through the
server, a leaf that becomes an image while its file is open, and falling back to libfuse.

The mount tests need root (mount(2)); the others run anywhere."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest

from tenplex.ir.box import Box
from tenplex.runtime.fuse import backing as backing_mod
from tenplex.runtime.fuse import kernel as k
from tenplex.runtime.fuse.backing import Backings
from tenplex.runtime.fuse.mount import mount_type
from tenplex.runtime.fuse.nodes import ROOT, Listings, Nodes
from tenplex.runtime.fuse.npy import NpyFile
from tenplex.runtime.fuse.store import StoreFS, fuse_unavailable_reason, mount
from tenplex.runtime.fuse.store.view import DIRECT_IO_FROM
from tenplex.runtime.store.image import is_image, npy_image, put_image
from tenplex.runtime.store.shared import Arena
from tenplex.runtime.store.tree import TensorStore


def test_protocol_structs_have_the_kernels_sizes():
    assert (k.IN_HEADER.size, k.OUT_HEADER.size, k.INIT_OUT.size, k.ATTR.size) == (40, 16, 64, 88)
    assert (k.ENTRY.size + k.ATTR.size, k.ATTR_OUT.size + k.ATTR.size, k.OPEN_OUT.size, k.STATFS_OUT.size) == (128, 104, 16, 80)
    assert len(k.dirent(5, 1, b"abc", 0o100644)) == 32 and len(k.dirent(5, 1, b"a" * 8, 0o40755)) == 32


def test_nodes_count_lookups_and_never_reuse_an_id():
    nodes = Nodes()
    assert nodes.path(ROOT) == "/" and nodes.child_path(ROOT, b"a") == "/a"
    a = nodes.looked_up("/a")
    assert nodes.looked_up("/a") == a and nodes.peek("/a") == a
    nodes.forget(a, 1)
    assert nodes.path(a) == "/a"  # one lookup still held
    nodes.forget(a, 1)
    with pytest.raises(OSError) as e:
        nodes.path(a)
    assert e.value.errno == errno.ENOENT
    assert nodes.looked_up("/a") not in (a, ROOT)
    for bad in (b"x/y", b"..", b"\xff"):
        with pytest.raises(OSError):
            nodes.child_path(ROOT, bad)


class _Dir:
    """Operations with a listing and a handle per opendir."""

    def __init__(self) -> None:
        self.released = []

    def opendir(self, path: str) -> int:
        return 7

    def readdir_plus(self, path: str, fh: int) -> list:
        return [(".", {"st_mode": 0o40755}), ("x.npy", {"st_mode": 0o100644, "st_size": 3})]

    def releasedir(self, path: str, fh: int) -> None:
        self.released.append((path, fh))


def test_a_listing_is_taken_once_per_opendir():
    ops, listings = _Dir(), Listings()
    h = listings.open("/d", ops)
    assert listings.get(h) == ("/d", [(b"x.npy", {"st_mode": 0o100644, "st_size": 3})])
    listings.close(h, ops)
    assert ops.released == [("/d", 7)]
    with pytest.raises(KeyError):
        listings.get(h)


def test_backings_never_mix_modes_on_an_inode(monkeypatch, tmp_path):
    ids = iter(range(1, 100))
    closed = []
    monkeypatch.setattr(backing_mod.k, "backing_open", lambda dev, fd: next(ids))
    monkeypatch.setattr(backing_mod.k, "backing_close", lambda dev, i: closed.append(i))
    f1, f2 = (os.open(tmp_path / n, os.O_CREAT | os.O_RDONLY) for n in ("a", "b"))
    b = Backings(-1)
    assert b.open(10, 1, f1, 0) == (k.FOPEN_PASSTHROUGH, 1)
    assert b.open(10, 2, f1, 0) == (k.FOPEN_PASSTHROUGH, 1)  # one id per backing file
    assert b.open(10, 3, f2, 0) == (k.FOPEN_DIRECT_IO, 0)  # another backing file: no mixing
    assert b.open(10, 4, None, k.FOPEN_KEEP_CACHE) == (k.FOPEN_DIRECT_IO, 0)  # no page cache either
    for fh in (1, 3, 4):
        b.release(fh)
    assert closed == [] and len(b) == 1
    b.release(2)
    assert closed == [1] and len(b) == 0
    assert b.open(11, 5, None, k.FOPEN_KEEP_CACHE) == (k.FOPEN_KEEP_CACHE, 0)
    assert b.open(11, 6, f1, 0) == (0, 0)  # page-cache opens are live: served without passthrough
    os.close(f1)
    os.close(f2)


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(2.5),
                                   np.zeros((0, 3), np.int8), (np.arange(6) % 5).astype(ml_dtypes.bfloat16),
                                   np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))],
                         ids=["c", "0-d", "empty", "bf16", "fortran"])  # fmt: skip
def test_an_image_is_the_views_npy_file(array):
    store = TensorStore()
    got = put_image(store, "/a", array)
    np.testing.assert_array_equal(got, array)
    arena, offset = store.shared("/a")
    f = NpyFile.from_leaf(store.get("/a"), store.shared("/a"))
    assert f.image is arena
    assert bytes(arena.map[: arena.size]) == f.read(f.size, 0)
    if array.dtype != ml_dtypes.bfloat16:
        import io

        out = io.BytesIO()
        np.save(out, np.array(array, order="C"))
        assert bytes(arena.map[: arena.size]) == out.getvalue()


def test_arrays_in_other_arenas_are_not_images():
    arena = Arena.create(4096)
    store = TensorStore()
    store.put_shared(arena, [("/a", 128, (4,), np.float32)])  # header-sized offset, but no header
    assert NpyFile.from_leaf(store.get("/a"), store.shared("/a")).image is None
    image, offset = npy_image(np.arange(4, dtype=np.float32))
    header = NpyFile.from_leaf(np.arange(4, dtype=np.float32)).header
    address = np.frombuffer(image.map, np.uint8).ctypes.data + offset
    assert is_image(image, offset, header, address, 16)
    assert not is_image(image, offset, header, None, 16)  # an array elsewhere in memory
    assert not is_image(image, offset, header.replace(b"<f4", b"<i4"), address, 16)  # another header


# ---- a real mount (root) ------------------------------------------------------------------------

REASON = fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mount(2) of FUSE needs root")
needs_mount = pytest.mark.skipif(REASON is not None, reason=f"FUSE session unavailable: {REASON}")


class _Counting(StoreFS):
    """`StoreFS` that counts the reads the server answers."""

    reads = 0

    def read_buf(self, path, size, offset, fh):
        type(self).reads += 1
        return super().read_buf(path, size, offset, fh)


def _child(code: str, *args: object) -> str:
    script = "import sys, numpy as np\nargv = sys.argv[1:]\n" + code
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def served(tmp_path):
    """A store with an image leaf, a plain one and a value, mounted read-only by a session."""
    from tenplex.runtime.fuse.session import mount_session

    store = TensorStore()
    big = np.arange(1 << 20, dtype=np.float32)
    put_image(store, "/d/img", big)
    store.put("/d/plain", big[::2])
    store.put("/d/cfg", {"lr": 0.5})
    _Counting.reads = 0
    (tmp_path / "m").mkdir()
    with mount_session(_Counting(store, read_only=True), str(tmp_path / "m"), direct_io_from=DIRECT_IO_FROM) as session:
        yield store, session, big
    store.close()


@pytest.mark.fuse
@needs_mount
def test_image_leaves_are_passed_through(served):
    store, session, big = served
    m = session.directory
    assert sorted(os.listdir(f"{m}/d")) == ["cfg.json", "img.npy", "plain.npy"]
    want = NpyFile.from_leaf(store.get("/d/img"))
    with open(f"{m}/d/img.npy", "rb") as f:
        assert f.read() == want.read(want.size, 0)
    if not session.passthrough:
        pytest.skip("the kernel offers no FUSE passthrough")
    assert _Counting.reads == 0  # the kernel read the memory file itself
    check = "a = np.load(argv[0], mmap_mode='r'); print(a[:2], int(a[-1])); sys.stdin.readline(); print(a[:2])"
    proc = subprocess.Popen([sys.executable, "-c", "import sys, numpy as np\nargv = sys.argv[1:]\n" + check,
                             f"{m}/d/img.npy"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    first = proc.stdout.readline()
    store.write("/d/img", Box.from_shape((2,)), np.array([7, 8], np.float32))
    out, _ = proc.communicate("\n", timeout=60)
    assert first.split() == ["[0.", "1.]", "1048575"] and out.split() == ["[7.", "8.]"]  # the store's pages
    assert _Counting.reads == 0


@pytest.mark.fuse
@needs_mount
def test_other_leaves_are_read_through_the_server(served):
    store, session, big = served
    m = session.directory
    assert _child("print(np.load(argv[0]).sum() == np.arange(1 << 20, dtype=np.float32)[::2].sum())",
                  f"{m}/d/plain.npy") == "True"  # fmt: skip
    assert _Counting.reads > 0
    # 2 MiB: opened with direct I/O (one copy per READ, no page cache: a second read asks again),
    # still mapped shared (DIRECT_IO_ALLOW_MMAP); the small JSON file goes through the page cache
    for name, again in (("plain.npy", True), ("cfg.json", False)):
        with open(f"{m}/d/{name}", "rb", buffering=0) as f:
            first, before = f.read(), _Counting.reads
            f.seek(0)
            assert f.read() == first and (_Counting.reads > before) == again, name
    assert _child("print(int(np.load(argv[0], mmap_mode='r')[-1]))", f"{m}/d/plain.npy") == str((1 << 20) - 2)
    with open(f"{m}/d/cfg.json") as f:
        assert f.read() == '{"lr": 0.5}\n'
    assert os.getxattr(f"{m}/d/img.npy", "user.tenplex.dtype") == b"float32"
    assert abs(os.stat(f"{m}/d/cfg.json").st_mtime - time.time()) < 600  # the view's ns times, as times
    with pytest.raises(FileNotFoundError):
        os.stat(f"{m}/d/nope.npy")
    with pytest.raises(OSError) as e, open(f"{m}/d/new.npy", "wb"):
        pass
    assert e.value.errno == errno.EROFS


@pytest.mark.fuse
@needs_mount
def test_a_leaf_that_becomes_an_image_while_open_still_reads(served):
    store, session, big = served
    m = session.directory
    with open(f"{m}/d/plain.npy", "rb") as old:
        old.read(64)
        put_image(store, "/d/plain", big + 1, replace=True)
        time.sleep(1.1)  # the kernel's cached attributes (and size) expire
        with open(f"{m}/d/plain.npy", "rb") as new:
            data = new.read()
    assert np.array_equal(np.frombuffer(data[-len(big) * 4 :], np.float32), big + 1)
    with open(f"{m}/d/plain.npy", "rb") as again:
        assert again.read() == data


@pytest.mark.fuse
@needs_mount
def test_the_store_view_uses_the_session_read_only_and_libfuse_otherwise(tmp_path):
    store = TensorStore()
    put_image(store, "/a", np.arange(10, dtype=np.int64))
    (tmp_path / "m").mkdir()
    for read_only, lowlevel, fstype in ((True, None, "fuse.tenplex"), (True, False, "fuse"), (False, None, "fuse")):
        with mount(store, str(tmp_path / "m"), read_only=read_only, lowlevel=lowlevel) as m:
            assert mount_type(m) == fstype, (read_only, lowlevel)
            assert _child("print(np.load(argv[0]).sum())", f"{m}/a.npy") == "45"


def test_a_loaded_store_directory_holds_c_order_arrays_as_images(tmp_path):
    from tenplex.runtime.checkpoint.store_dir import open_dir
    from tenplex.runtime.checkpoint.write import save

    want = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, ml_dtypes.bfloat16)}
    save(want, tmp_path / "s")
    sd = open_dir(tmp_path / "s")
    leaves = {p.rsplit("/", 1)[1].split(".")[0]: p for p in sd.store.walk() if sd.store.meta(p).kind == "array"}
    assert sorted(leaves) == ["b", "w"], leaves
    for name, p in leaves.items():
        assert NpyFile.from_leaf(sd.store.get(p), sd.store.shared(p)).image is not None, name
        got = sd.store.get(p)
        assert got.dtype == want[name].dtype and np.array_equal(got, want[name]), name
    sd.store.close()


class _Broken:
    """Operations whose file `bad` fails with a bug (not an OSError), and no xattrs at all."""

    use_ns = True

    def getattr(self, path: str) -> dict:
        if path == "/bad":
            raise ValueError("a bug")
        if path in ("/", "/ok"):
            return {"st_mode": 0o40755 if path == "/" else 0o100444, "st_size": 2 if path == "/ok" else 0}
        raise OSError(errno.ENOENT, path)

    def readdir(self, path: str, fh: int) -> list:
        return [".", "..", "ok", "bad"]

    def open(self, path: str, flags: int) -> int:
        return 1

    def open_flags(self, fh: int) -> tuple[bool, bool]:
        return False, False

    def read_buf(self, path, size, offset, fh):
        return [b"hi"[offset : offset + size]]

    def release(self, path, fh):
        raise RuntimeError("ignored: the file is closed anyway")


@pytest.mark.fuse
@needs_mount
def test_failures_become_errors_and_the_session_serves_on(tmp_path, caplog):
    from tenplex.runtime.fuse.session import mount_session

    (tmp_path / "m").mkdir()
    with mount_session(_Broken(), str(tmp_path / "m"), read_ahead_kb=None) as session:
        m = session.directory
        with pytest.raises(OSError) as e:
            os.stat(f"{m}/bad")
        assert e.value.errno == errno.EIO and "a bug" in caplog.text  # logged, answered EIO
        assert sorted(os.listdir(m)) == ["bad", "ok"]  # plain READDIR: attributes by getattr
        with open(f"{m}/ok", "rb") as f:
            assert f.read() == b"hi"
        with pytest.raises(OSError) as e:
            os.getxattr(f"{m}/ok", "user.x")
        assert e.value.errno in (errno.ENOSYS, errno.EOPNOTSUPP)  # the view has no xattrs
        assert os.statvfs(m).f_bsize == 4096


@pytest.mark.fuse
@needs_mount
def test_without_passthrough_images_are_read_through_the_server(tmp_path):
    from tenplex.runtime.fuse.session import mount_session

    store = TensorStore()
    put_image(store, "/img", np.arange(1 << 16, dtype=np.int32))
    _Counting.reads = 0
    (tmp_path / "m").mkdir()
    with mount_session(_Counting(store, read_only=True), str(tmp_path / "m"), passthrough=False) as session:
        assert not session.passthrough
        assert _child("print(np.load(argv[0])[-3:].tolist())", f"{session.directory}/img.npy") == "[65533, 65534, 65535]"
    assert _Counting.reads > 0


def test_a_loaded_store_directory_falls_back_to_memory_without_descriptors(tmp_path, monkeypatch):
    from tenplex.runtime.checkpoint import store_dir
    from tenplex.runtime.checkpoint.write import save

    save({"w": np.arange(6, dtype=np.float32)}, tmp_path / "s")

    def no_fds(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(store_dir, "put_image", no_fds)
    sd = store_dir.open_dir(tmp_path / "s")
    (path,) = [p for p in sd.store.walk() if sd.store.meta(p).kind == "array"]
    assert sd.store.shared(path) is None and sd.store.get(path).tolist() == list(range(6))
    sd.store.close()
