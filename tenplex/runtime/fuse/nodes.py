"""The names a `fuse.session` gives the kernel: `Nodes`, which path each node id the kernel
holds names and how many lookups of it the kernel holds (LOOKUP replies and READDIRPLUS entries
add one each; FORGET takes them back; at zero the id is free and a later lookup of the path gets
a new one), and `Listings`, the entries of each open directory, listed once at OPENDIR so that
the READDIR(PLUS) requests that page through them see one listing.

Invariants: the root `/` is id 1 and never forgotten; a held id names one path; ids are not
reused while the session lives (a stale id from the kernel is ENOENT, never another file).
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
from typing import Any

ROOT = 1


class Nodes:
    """Thread-safe id <-> path table with lookup counts (module doc)."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {ROOT: "/"}
        self._ids: dict[str, int] = {"/": ROOT}
        self._counts: dict[int, int] = {}
        self._next = itertools.count(ROOT + 1)
        self._lock = threading.Lock()

    def path(self, nodeid: int) -> str:
        """The path of a held id. Raises OSError ENOENT for an id the table does not hold."""
        try:
            return self._paths[nodeid]
        except KeyError:
            raise OSError(errno.ENOENT, f"{os.strerror(errno.ENOENT)}: node {nodeid}") from None

    def child_path(self, parent: int, name: bytes) -> str:
        """The path of `name` in directory `parent`. Raises OSError ENOENT (unknown parent,
        undecodable name) or EINVAL (a name with '/')."""
        try:
            text = name.decode()
        except UnicodeDecodeError:
            raise OSError(errno.ENOENT, f"{name!r} is not UTF-8") from None
        if "/" in text or text in ("", ".", ".."):
            raise OSError(errno.EINVAL, f"invalid name {text!r}")
        return self.path(parent).rstrip("/") + "/" + text

    def looked_up(self, path: str) -> int:
        """The id of `path`, counting one more lookup that the kernel holds."""
        with self._lock:
            nodeid = self._ids.get(path)
            if nodeid is None:
                nodeid = self._ids[path] = next(self._next)
                self._paths[nodeid] = path
            if nodeid != ROOT:
                self._counts[nodeid] = self._counts.get(nodeid, 0) + 1
            return nodeid

    def peek(self, path: str) -> int:
        """The id of `path` if the kernel holds it, else a number no id takes (for plain READDIR)."""
        return self._ids.get(path, 0xFFFFFFFF)

    def forget(self, nodeid: int, count: int) -> None:
        """The kernel dropped `count` lookups of `nodeid`; at zero the id is freed."""
        with self._lock:
            left = self._counts.get(nodeid, 0) - count
            if left > 0:
                self._counts[nodeid] = left
                return
            self._counts.pop(nodeid, None)
            path = self._paths.pop(nodeid, None) if nodeid != ROOT else None
            if path is not None and self._ids.get(path) == nodeid:
                del self._ids[path]

    def __len__(self) -> int:
        return len(self._paths)


class Listings:
    """Open directories: handle -> (path, the operations' handle, [(name, attributes)])."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[str, int, list[tuple[bytes, dict]]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(self, path: str, ops: Any) -> int:
        """List `path` with `ops` (`opendir` if it has one, then `readdir_plus` or `readdir` and
        `getattr`, None for an entry whose `getattr` fails; without `.` and `..`); the handle of
        the listing."""
        fh = ops.opendir(path) if hasattr(ops, "opendir") else 0
        if (plus := getattr(ops, "readdir_plus", None)) is not None:
            entries = plus(path, fh)
        else:
            base = path.rstrip("/") + "/"
            entries = [(n, _attrs(ops, base + n)) for n in ops.readdir(path, fh) if n not in (".", "..")]
        with self._lock:
            handle = next(self._ids)
            self._open[handle] = (path, fh, [(n.encode(), a) for n, a in entries if n not in (".", "..")])
        return handle

    def get(self, handle: int) -> tuple[str, list[tuple[bytes, dict]]]:
        path, _, entries = self._open[handle]
        return path, entries

    def close(self, handle: int, ops: Any) -> None:
        """Forget the listing (and `releasedir` it with `ops` if it has that)."""
        with self._lock:
            path, fh, _ = self._open.pop(handle, (None, 0, None))
        if path is not None and hasattr(ops, "releasedir"):
            ops.releasedir(path, fh)


def _attrs(ops: Any, path: str) -> dict | None:
    try:
        return ops.getattr(path)
    except Exception:  # listed without attributes: a lookup of it reports the failure
        return None
