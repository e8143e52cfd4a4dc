"""The store's end of the local socket: serves a `TensorStore` to processes of the same user on
the same machine (a training program's ranks), through shared memory.

`StoreServer(store, path, host).start()` listens on the Unix socket `path` (mode 0600) and
serves each connection from a thread of its own. Requests are `{"cmd", "args"}` frames (`wire`),
replies `{"ok": result}` or `{"err": text}`:

- `hello` -> {"host", "pid"};
- `put` (one arena descriptor attached): `{"items": [[path, offset, shape, dtype], ...],
  "values": {path: JSON value}, "replace": bool}` adopts the arena's arrays as leaves without a
  copy (`TensorStore.put_shared`) and stores the values; all or nothing;
- `get` `{"paths": [...]}` -> `{"arrays": {path: [arena index, offset, shape, dtype]}, "values":
  {path: value}}` with the arenas attached: a leaf that lives in an arena is sent as that arena
  (the reader maps the very pages), any other leaf is copied once into a new arena;
- `rename` `{src, dst, replace}`, `delete` `{path}`, `exists` `{path}`, `walk` `{prefix}`.

Every path must lie under `/job/` (the part of the store that holds jobs' state). A peer whose
uid is not the server's (nor root) is refused at connect (`SO_PEERCRED`).

Invariants:
- a failed request changes nothing in the store, and every descriptor it carried is closed;
- a connection's failure never stops the server or other connections.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from typing import Any

import numpy as np

from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.shm.wire import ShmError, recv, send
from tenplex.runtime.store.leaf import StoreError
from tenplex.runtime.store.shared import Arena, layout
from tenplex.runtime.store.tree import TensorStore

log = logging.getLogger("tenplex.agent")
ROOT = "/job/"


class StoreServer:
    """Serves `store` on the Unix socket `path` (see the module docstring)."""

    def __init__(self, store: TensorStore, path: str, host: str):
        self.store, self.path, self.host = store, path, host
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.closed = threading.Event()

    def start(self) -> StoreServer:
        """Listen and serve from a daemon thread. Raises ShmError naming the socket path."""
        try:
            with contextlib.suppress(FileNotFoundError):
                if os.path.exists(self.path) and not _is_socket(self.path):
                    raise ShmError(f"{self.path}: exists and is not a socket (refusing to replace it)")
                os.unlink(self.path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                listener.bind(self.path)
            finally:
                os.umask(old)
            listener.listen(64)
        except OSError as e:
            raise ShmError(f"{self.path}: cannot listen for local processes: {e.strerror or e}") from None
        self.listener = listener
        self.thread = threading.Thread(target=self._accept, name="tenplex-store-local", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.closed.set()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid not in (os.getuid(), 0):
                log.warning("store %s: refused a local process of uid %d", self.host, uid)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="tenplex-store-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    got = recv(conn)
                except ShmError:
                    return
                if got is None:
                    return
                request, fds = got
                reply, out = self._run(request, fds)
                for a in out:
                    a.exported = True  # another process maps it now: never recycled
                try:
                    send(conn, reply, [a.fd for a in out])
                except ShmError:
                    return

    def _run(self, request: Any, fds: list[int]) -> tuple[dict, list[Arena]]:
        name = request.get("cmd") if isinstance(request, dict) else None
        args = request.get("args") if isinstance(request, dict) else None
        try:
            if name == "put":
                if len(fds) != 1:
                    raise ShmError(f"put needs one arena descriptor, got {len(fds)}")
                arena, fds = Arena.adopt(fds[0], writable=True), []
                return {"ok": self._put(arena, **args)}, []
            for fd in fds:
                os.close(fd)
            fds = []
            if name == "hello":
                return {"ok": {"host": self.host, "pid": os.getpid()}}, []
            if name == "get":
                return self._get(**args)
            if name in ("rename", "delete", "exists", "walk"):
                return {"ok": getattr(self, f"_{name}")(**args)}, []
            raise ShmError(f"unknown request {name!r}")
        except (StoreError, ShmError, OSError, TypeError, ValueError) as e:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return {"err": f"{name or 'request'} failed on host {self.host}: {e}"}, []

    def _put(self, arena: Arena, items: list, values: dict, replace: bool = False) -> int:
        parsed = [(_checked(p), int(o), tuple(int(n) for n in s), np_dtype(d)) for p, o, s, d in items]
        for path in values:
            _checked(path)
        self.store.put_shared(arena, parsed, replace=replace)
        try:
            for path, value in values.items():
                self.store.put(path, value, replace=replace)
        except StoreError:
            for path, *_ in parsed:
                with contextlib.suppress(StoreError):
                    self.store.delete(path)
            raise
        return sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for _, _, s, d in parsed)

    def _get(self, paths: list[str]) -> tuple[dict, list[Arena]]:
        arenas: dict[int, int] = {}  # id(arena) -> index in the reply
        out: list[Arena] = []
        arrays, values, copies = {}, {}, []
        for path in map(_checked, paths):
            leaf = self.store.meta(path)
            if leaf.kind == "value":
                values[path] = self.store.get(path)
                continue
            shared = self.store.shared(path)
            if shared is None:
                copies.append(path)
                continue
            arena, offset = shared
            index = arenas.setdefault(id(arena), len(out))
            if index == len(out):
                out.append(arena)
            arrays[path] = [index, offset, list(leaf.shape), leaf.dtype]
        if copies:  # leaves outside arenas: one new arena, one copy each
            got = [self.store.get(p) for p in copies]
            offsets, size = layout(a.nbytes for a in got)
            arena = Arena.create(size, "tenplex-get")
            for p, a, at in zip(copies, got, offsets):
                arena.array(at, a.shape, a.dtype)[...] = a
                arrays[p] = [len(out), at, list(a.shape), str(a.dtype)]
            out.append(arena)
        return {"ok": {"arrays": arrays, "values": values}}, out

    def _rename(self, src: str, dst: str, replace: bool = False) -> bool:
        self.store.rename(_checked(src), _checked(dst), replace=replace)
        return True

    def _delete(self, path: str) -> bool:
        if not self.store.exists(_checked(path)):
            return False
        self.store.delete(path)
        return True

    def _exists(self, path: str) -> bool:
        return self.store.exists(_checked(path))

    def _walk(self, prefix: str) -> list[str]:
        return self.store.walk(_checked(prefix)) if self.store.exists(prefix) else []


def _checked(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith(ROOT):
        raise ShmError(f"path {path!r} is not under {ROOT} (local processes reach jobs' state only)")
    return path


def _is_socket(path: str) -> bool:
    import stat

    return stat.S_ISSOCK(os.lstat(path).st_mode)
