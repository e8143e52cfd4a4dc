"""A read-only FUSE file system served on `/dev/fuse` in the kernel's own protocol (`fuse.kernel`),
without libfuse: what a root process uses to get what libfuse 3.14 cannot ask the kernel for.

- **passthrough** (Linux >= 6.9, CAP_SYS_ADMIN): a file whose operations name a backing file
  (`ops.backing(fh)`: a descriptor of exactly its bytes: a `.npy` image, a dataset's source
  file) is opened with `FOPEN_PASSTHROUGH`: the kernel reads and maps it itself (tmpfs speed);
- other reads: one `writev` of the memory the operations name (`fuse.splice` segments), or one
  `splice.send` where they name file ranges (copied once, from the page cache into the reader),
  in requests of up to `splice.MAX_READ` bytes; from `direct_io_from` bytes with direct I/O,
  still mapped shared;
- no FLUSH on close (answered ENOSYS once, the kernel stops sending it), listings carry the
  attributes (READDIRPLUS) and `default_permissions` lets the kernel check modes itself.

The operations are path-based, as mfusepy's (`getattr`, `readdir_plus` or `readdir`, `open`,
`open_flags`, `read_buf`, `release`, optional `opendir`, `releasedir`, `getxattr`, `listxattr`,
`backing`; times in ns where `ops.use_ns`, as mfusepy's); `Session` keeps the node ids the
kernel holds (LOOKUP and READDIRPLUS entries count, FORGET releases) and runs `threads` threads
reading requests.

Invariants:
- every request that wants a reply gets exactly one (an error for an operation the view lacks,
  or one that raised: OSError's errno, else EIO, logged);
- a node id names one path for as long as the kernel holds it; the root is 1;
- an open that the kernel did not take (interrupted) is released at once, as libfuse does;
- backing ids live while open files use them (`fuse.backing`).

Raises: `SessionUnavailable` when `/dev/fuse` cannot be opened or mount(2) is refused (not
root): callers fall back to libfuse (`fuse.mount`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from tenplex.ir.errors import TenplexError
from tenplex.runtime.fuse import kernel as k
from tenplex.runtime.fuse import splice
from tenplex.runtime.fuse.backing import Backings
from tenplex.runtime.fuse.mount import READ_AHEAD_KB, FuseUnavailable, is_mounted, mount_entry, set_read_ahead
from tenplex.runtime.fuse.nodes import Listings, Nodes

log = logging.getLogger(__name__)
TIMEOUT = 1.0  # s that the kernel caches names and attributes (changes to the store show within it)
_REQUEST_BYTES = 64 << 10  # a read-only view gets no WRITE: the largest request is a name
_STATFS = k.STATFS_OUT.pack(0, 0, 0, 0, 0, 4096, 255, 4096, 0)  # no blocks, 4 KiB, names up to 255


class SessionUnavailable(TenplexError):
    """The kernel protocol cannot be served here (no /dev/fuse, or mount(2) refused)."""


class Session:
    """`ops` mounted read-only at `directory` until `close` (see the module doc)."""

    def __init__(self, ops: Any, directory: str, *, threads: int = 2, passthrough: bool = True,
                 direct_io_from: int | None = None, fsname: str = "tenplex") -> None:  # fmt: skip
        self.ops, self.directory, self.passthrough, self.direct_io_mmap = ops, directory, False, False
        self.direct_io_from, self._want_passthrough = direct_io_from, passthrough
        self.nodes, self.listings = Nodes(), Listings()
        try:
            self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise SessionUnavailable(f"cannot open /dev/fuse: {e.strerror}") from None
        try:
            k.mount(self.fd, directory, fsname, splice.MAX_READ)
        except OSError as e:
            os.close(self.fd)
            raise SessionUnavailable(str(e)) from None
        self.backings = Backings(self.fd)
        self._pipes = splice.Pipes()
        self.threads = [threading.Thread(target=self._serve, name=f"tenplex-fuse-ll:{directory}", daemon=True)
                        for _ in range(threads)]  # fmt: skip
        for t in self.threads:
            t.start()

    # -- the request loop --------------------------------------------------------------------

    def _serve(self) -> None:
        buf = bytearray(_REQUEST_BYTES)
        view = memoryview(buf)
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except OSError as e:
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue  # ENOENT: the request was interrupted before we read it
                return  # ENODEV: unmounted (or aborted)
            _, op, unique, nodeid, *_ = k.IN_HEADER.unpack_from(buf)
            self._dispatch(op, unique, nodeid, view[k.IN_HEADER.size : n])

    def _dispatch(self, op: int, unique: int, nodeid: int, arg: memoryview) -> None:
        handler = self._HANDLERS.get(op)
        try:
            if handler is None:
                if op not in k.NO_REPLY:
                    self._error(unique, errno.ENOSYS)
                elif op == k.FORGET:
                    self.nodes.forget(nodeid, int.from_bytes(arg[:8], "little"))
                elif op == k.BATCH_FORGET:
                    count = int.from_bytes(arg[:4], "little")
                    for i in range(count):
                        self.nodes.forget(*k.FORGET_ONE.unpack_from(arg, 8 + 16 * i))
                return
            handler(self, unique, nodeid, arg)
        except OSError as e:
            if e.errno is None or e.errno <= 0:
                log.exception("FUSE operation %d failed", op)
            self._error(unique, e.errno if e.errno and e.errno > 0 else errno.EIO)
        except Exception:
            log.exception("FUSE operation %d failed", op)
            self._error(unique, errno.EIO)

    def _reply(self, unique: int, parts: Sequence[Any] = ()) -> bool:
        """Send a reply; False if the kernel no longer waits for it (interrupted meanwhile)."""
        size = k.OUT_HEADER.size + sum(memoryview(p).nbytes for p in parts)
        try:
            os.writev(self.fd, [k.OUT_HEADER.pack(size, 0, unique), *parts])
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
            return False
        return True

    def _error(self, unique: int, err: int) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, k.OUT_HEADER.pack(k.OUT_HEADER.size, -err, unique))

    # -- handlers ------------------------------------------------------------------------------

    def _init(self, unique: int, nodeid: int, arg: memoryview) -> None:
        major, minor, readahead, flags, flags2 = k.INIT_IN.unpack_from(arg)
        offered = flags | (flags2 << 32 if flags & k.INIT_EXT else 0)
        # libfuse's defaults that a read-only view uses (cached pages dropped when a file's size or
        # mtime changes; several requests in flight for one O_DIRECT read), and what it cannot ask
        want = k.ASYNC_READ | k.AUTO_INVAL_DATA | k.DO_READDIRPLUS | k.ASYNC_DIO | k.PARALLEL_DIROPS | k.MAX_PAGES
        want |= k.INIT_EXT
        if self._want_passthrough:
            want |= k.PASSTHROUGH
        want = (want | k.DIRECT_IO_ALLOW_MMAP) & offered
        self.passthrough, self.direct_io_mmap = bool(want & k.PASSTHROUGH), bool(want & k.DIRECT_IO_ALLOW_MMAP)
        out = k.INIT_OUT.pack(k.MAJOR, min(minor, k.MINOR), readahead, want & 0xFFFFFFFF, 0, 0, 4096, 1,
                              max(1, splice.MAX_READ // 4096), 0, want >> 32, 1 if self.passthrough else 0, 0)  # fmt: skip
        self._reply(unique, [out])

    def _lookup(self, unique: int, nodeid: int, arg: memoryview) -> None:
        name = bytes(arg).split(b"\0", 1)[0]
        path = self.nodes.child_path(nodeid, name)
        self._reply(unique, [self._entry(path, self.ops.getattr(path))])

    def _entry(self, path: str, attrs: dict) -> bytes:
        ino = self.nodes.looked_up(path)
        return k.entry(ino, self._attr(ino, attrs), TIMEOUT)

    def _attr(self, ino: int, a: dict) -> bytes:
        mtime = a.get("st_mtime", 0)
        mtime_ns = int(mtime if getattr(self.ops, "use_ns", False) else mtime * 1e9)
        return k.attr(ino, a["st_mode"], a.get("st_size", 0), a.get("st_nlink", 1), a.get("st_uid", os.geteuid()),
                      a.get("st_gid", os.getegid()), mtime_ns)  # fmt: skip

    def _getattr(self, unique: int, nodeid: int, arg: memoryview) -> None:
        attrs = self.ops.getattr(self.nodes.path(nodeid))
        self._reply(unique, [k.ATTR_OUT.pack(int(TIMEOUT), int(TIMEOUT % 1 * 1e9), 0), self._attr(nodeid, attrs)])

    def _open(self, unique: int, nodeid: int, arg: memoryview) -> None:
        path = self.nodes.path(nodeid)
        fh = self.ops.open(path, int.from_bytes(arg[:4], "little"))
        try:
            direct_io, keep_cache = self.ops.open_flags(fh)
            direct_io = direct_io or (not keep_cache and self._large(path))
            flags = (k.FOPEN_DIRECT_IO if direct_io else 0) | (k.FOPEN_KEEP_CACHE if keep_cache else 0)
            get = getattr(self.ops, "backing", None)
            fd = get(fh) if self.passthrough and get is not None else None
            try:
                flags, backing = self.backings.open(nodeid, fh, fd, flags)
            except OSError as e:  # e.g. EPERM in a user namespace: serve the bytes from here on
                log.info("FUSE passthrough refused (%s); reads of %s go through this process", e, self.directory)
                self.passthrough = False
                flags, backing = self.backings.open(nodeid, fh, None, flags)
            taken = self._reply(unique, [k.OPEN_OUT.pack(fh, flags, backing)])
        except BaseException:
            taken = False
            raise
        finally:
            if not taken:  # no RELEASE will come for it
                self.backings.release(fh)
                with contextlib.suppress(Exception):
                    self.ops.release(path, fh)

    def _large(self, path: str) -> bool:
        """Whether `path` is a file of at least `direct_io_from` bytes that direct I/O may serve
        (the kernel maps such files shared through its page cache: DIRECT_IO_ALLOW_MMAP)."""
        if self.direct_io_from is None or not self.direct_io_mmap:
            return False
        return self.ops.getattr(path).get("st_size", 0) >= self.direct_io_from

    def _read(self, unique: int, nodeid: int, arg: memoryview) -> None:
        fh, offset, size = k.READ_IN.unpack_from(arg)
        segments = self.ops.read_buf(None, size, offset, fh)
        if any(isinstance(s, splice.FileRange) for s in segments):  # spliced, else read here: one buffer
            head = k.OUT_HEADER.pack(k.OUT_HEADER.size + splice.size_of(segments), 0, unique)
            if splice.send(self._pipes, self.fd, [head, *segments]):
                return
            segments = [splice.gather(segments)]
        self._reply(unique, segments)

    def _release(self, unique: int, nodeid: int, arg: memoryview) -> None:
        (fh,) = k.RELEASE_IN.unpack_from(arg)
        self.backings.release(fh)
        try:
            self.ops.release(None, fh)
        except Exception:  # the file is closed whatever the view says
            log.exception("FUSE release of handle %d failed", fh)
        self._reply(unique)

    def _opendir(self, unique: int, nodeid: int, arg: memoryview) -> None:
        self._reply(unique, [k.OPEN_OUT.pack(self.listings.open(self.nodes.path(nodeid), self.ops), 0, 0)])

    def _readdir(self, unique: int, nodeid: int, arg: memoryview, plus: bool = False) -> None:
        fh, offset, size = k.READ_IN.unpack_from(arg)
        path, entries = self.listings.get(fh)
        out, base = bytearray(), path.rstrip("/") + "/"
        for i in range(offset, len(entries)):
            name, attrs = entries[i]
            need = len(k.dirent(0, 0, name, 0)) + (k.ENTRY.size + k.ATTR.size if plus else 0)
            if len(out) + need > size:
                break
            mode = 0 if attrs is None else attrs["st_mode"]  # 0: DT_UNKNOWN
            if plus and attrs is not None:  # the kernel holds the entry as if looked up
                entry = self._entry(base + name.decode(), attrs)
                out += entry + k.dirent(k.ENTRY.unpack_from(entry)[0], i + 1, name, mode)
            else:  # with node id 0 in a READDIRPLUS entry the kernel takes no lookup of it
                head = bytes(k.ENTRY.size + k.ATTR.size) if plus else b""
                out += head + k.dirent(self.nodes.peek(base + name.decode()), i + 1, name, mode)
        self._reply(unique, [out])

    def _releasedir(self, unique: int, nodeid: int, arg: memoryview) -> None:
        self.listings.close(k.RELEASE_IN.unpack_from(arg)[0], self.ops)
        self._reply(unique)

    def _getxattr(self, unique: int, nodeid: int, arg: memoryview, names: bool = False) -> None:
        if (op := getattr(self.ops, "listxattr" if names else "getxattr", None)) is None:
            raise OSError(errno.ENOSYS, "no extended attributes")  # the kernel stops asking
        path, size = self.nodes.path(nodeid), int.from_bytes(arg[:4], "little")
        if names:
            value = b"".join(n.encode() + b"\0" for n in op(path))
        else:
            value = op(path, bytes(arg[8:]).split(b"\0", 1)[0].decode())
        if size and len(value) > size:
            raise OSError(errno.ERANGE, "xattr buffer too small")
        self._reply(unique, [value if size else k.SIZE_OUT.pack(len(value), 0)])

    _HANDLERS = {
        k.INIT: _init, k.LOOKUP: _lookup, k.GETATTR: _getattr, k.OPEN: _open, k.READ: _read,
        k.RELEASE: _release, k.OPENDIR: _opendir, k.READDIR: _readdir, k.RELEASEDIR: _releasedir,
        k.READDIRPLUS: lambda self, unique, nodeid, arg: self._readdir(unique, nodeid, arg, plus=True),
        k.GETXATTR: _getxattr, k.LISTXATTR: lambda self, unique, nodeid, arg: self._getxattr(unique, nodeid, arg, True),
        k.STATFS: lambda self, unique, nodeid, arg: self._reply(unique, [_STATFS]),
        k.DESTROY: lambda self, unique, nodeid, arg: self._reply(unique),
    }  # fmt: skip

    # -- the end -------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Unmount (lazily if a file is still open), wait up to `timeout` s for the threads, then
        abort the connection if they still serve (open files then fail with ENOTCONN)."""
        device = mount_entry(self.directory)
        k.unmount(self.directory)
        for t in self.threads:
            t.join(timeout)
        if any(t.is_alive() for t in self.threads) and device is not None:
            log.warning("FUSE session at %s still served after %s s (a file is open): aborting it", self.directory, timeout)
            k.abort(device)
            for t in self.threads:
                t.join(1.0)
        os.close(self.fd)
        self._pipes.close()


@contextlib.contextmanager
def mount_session(ops: Any, directory: str, *, read_ahead_kb: int | None = READ_AHEAD_KB, what: str = "FUSE view",
                  passthrough: bool = True, direct_io_from: int | None = None, fsname: str = "tenplex") -> Iterator[Any]:  # fmt: skip
    """Serve `ops` read-only at `directory` with `fuse.session.Session` (the kernel protocol,
    without libfuse) until the block ends; yield the session once the directory is a live mount
    point. Raises: SessionUnavailable (no /dev/fuse, mount(2) refused: use `mount` instead)."""
    directory = os.path.realpath(directory)
    if is_mounted(directory):
        raise FuseUnavailable(f"cannot mount the {what} at {directory}: already a mount point")
    session = Session(ops, directory, passthrough=passthrough, direct_io_from=direct_io_from, fsname=fsname)
    try:
        if read_ahead_kb is not None:
            set_read_ahead(directory, read_ahead_kb)
        yield session
    finally:
        session.close()
