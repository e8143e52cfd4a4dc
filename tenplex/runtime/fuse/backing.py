"""Which open files of a `fuse.session` the kernel passes through to a backing file, and the
backing ids that registers (`kernel.backing_open`).

The kernel attaches one backing file to an inode while files of it are open with passthrough,
and refuses an open that would mix modes on one inode (EIO): a second backing file while the
first is attached, or passthrough beside opens that use the page cache. So `Backings.open`
decides per open: passthrough when the inode has no open files or only passthrough ones of the
same backing file (one backing id per backing file, shared, dropped with its last open);
direct I/O (no page cache, no backing: compatible with both) when passthrough opens of another
backing file are live; the operations' own flags otherwise.

Invariants: a backing id is registered exactly while open files use it; an inode's live opens
never mix passthrough with page-cache opens or two backing files.
"""

from __future__ import annotations

import contextlib
import os
import threading

from tenplex.runtime.fuse import kernel as k

_CACHED = "cached"


class Backings:
    """The passthrough state of a session on the device `dev` (module doc). Thread-safe."""

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self._ids: dict[tuple[int, int], list[int]] = {}  # backing file (st_dev, st_ino): [id, opens]
        self._inodes: dict[int, list] = {}  # nodeid: [backing file key or _CACHED, opens]
        self._files: dict[int, tuple[int, object]] = {}  # fh: (nodeid, key or _CACHED or None)
        self._lock = threading.Lock()

    def open(self, nodeid: int, fh: int, fd: int | None, open_flags: int) -> tuple[int, int]:
        """(open flags, backing id or 0) for file `fh` of `nodeid` whose bytes are those of the
        open file `fd` (None: no backing file). Raises OSError if the kernel refuses the backing
        file (then call again with `fd=None`)."""
        with self._lock:
            live = self._inodes.get(nodeid)
            if fd is not None:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if live is None or live[0] == key:
                    return k.FOPEN_PASSTHROUGH, self._attach(nodeid, fh, key, fd, live)
            if live is not None and live[0] != _CACHED:
                self._files[fh] = (nodeid, None)
                return k.FOPEN_DIRECT_IO, 0  # passthrough opens of another backing file are live
            if open_flags & k.FOPEN_DIRECT_IO:
                self._files[fh] = (nodeid, None)
            else:
                self._count(nodeid, fh, _CACHED, live)
            return open_flags, 0

    def _attach(self, nodeid: int, fh: int, key: tuple[int, int], fd: int, live: list | None) -> int:
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = [k.backing_open(self.dev, fd), 0]
        got[1] += 1
        self._count(nodeid, fh, key, live)
        return got[0]

    def _count(self, nodeid: int, fh: int, key: object, live: list | None) -> None:
        if live is None:
            live = self._inodes[nodeid] = [key, 0]
        live[1] += 1
        self._files[fh] = (nodeid, key)

    def release(self, fh: int) -> None:
        """File `fh` was closed: drop its part (and a backing id that no open file uses)."""
        with self._lock:
            nodeid, key = self._files.pop(fh, (None, None))
            if key is None:
                return
            live = self._inodes[nodeid]
            live[1] -= 1
            if live[1] == 0:
                del self._inodes[nodeid]
            got = self._ids.get(key)
            if got is None:
                return
            got[1] -= 1
            if got[1] == 0:
                del self._ids[key]
                with contextlib.suppress(OSError):  # the connection is gone: so is the id
                    k.backing_close(self.dev, got[0])

    def __len__(self) -> int:
        """Backing ids registered now."""
        return len(self._ids)
