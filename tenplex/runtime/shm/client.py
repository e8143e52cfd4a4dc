"""The program's end of the local socket: `StoreClient(path)` talks to the store of this machine's
agent (`server`).

    with StoreClient("/run/tenplex/h0.store") as store:
        arena = store.arena({"/job/j/t/0/w": ((4, 2), "float32")})  # views to fill in place
        arena.views["/job/j/t/0/w"][...] = 1.0
        store.put(arena, values={"/job/j/t/0/.values/p/step": 7})
        got = store.get(["/job/j/t/0/w"])                          # read-only views, no copy

`arena` allocates one shared arena for many arrays (64-byte aligned); `put` hands it to the
store, which adopts the pages (the program writes its bytes once, the store copies nothing);
`get` maps the arenas the store's leaves live in. Views stay valid after the store deletes or
replaces the leaves (the pages live while mapped), but then no longer show the store's state.

Raises ShmError naming the socket for a store that cannot be reached, and the store's one-line
error for a refused request.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.shm.wire import ShmError, recv, send
from tenplex.runtime.store.shared import Arena, layout


@attrs.frozen(eq=False)
class Filled:
    """An arena being filled: the views to write (path -> array) and where each lies."""

    arena: Arena
    views: dict[str, np.ndarray]
    items: list[tuple[str, int, tuple[int, ...], str]]  # (path, offset, shape, dtype)


class StoreClient:
    def __init__(self, path: str | os.PathLike, timeout: float = 600.0):
        self.path = os.fspath(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
        except OSError as e:
            self.sock.close()
            raise ShmError(f"{self.path}: cannot reach the tenplex store ({e.strerror or e}); is the agent running "
                           "with a local socket there?") from None  # fmt: skip
        self.host = self._call("hello")["host"]

    # ---- writing ----------------------------------------------------------------------
    def arena(self, arrays: Mapping[str, tuple[Sequence[int], str | np.dtype]], name: str = "tenplex-put") -> Filled:
        """A new zero-filled arena with a view per path ({path: (shape, dtype)}) to write into."""
        specs = [(p, tuple(int(n) for n in shape), np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype))
                 for p, (shape, dtype) in arrays.items()]  # fmt: skip
        offsets, size = layout(int(np.prod(s, dtype=np.int64)) * d.itemsize for _, s, d in specs)
        arena = Arena.create(size, name)
        views = {p: arena.array(at, s, d) for (p, s, d), at in zip(specs, offsets)}
        items = [(p, at, s, str(d)) for (p, s, d), at in zip(specs, offsets)]
        return Filled(arena, views, items)

    def put(self, filled: Filled | None = None, values: Mapping[str, Any] | None = None, replace: bool = False) -> int:
        """Hand `filled`'s arrays (and `values`) to the store, all or nothing; returns the bytes."""
        if filled is None:
            filled = self.arena({})
        items = [[p, at, list(s), d] for p, at, s, d in filled.items]
        return self._call("put", [filled.arena.fd], items=items, values=dict(values or {}), replace=replace)

    def put_arrays(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any] | None = None,
                   replace: bool = False) -> int:  # fmt: skip
        """`put` of arrays the caller already has (one copy each into the arena)."""
        filled = self.arena({p: (a.shape, a.dtype) for p, a in arrays.items()})
        for p, a in arrays.items():
            filled.views[p][...] = a
        return self.put(filled, values, replace)

    # ---- reading ----------------------------------------------------------------------
    def get(self, paths: Iterable[str]) -> dict[str, Any]:
        """{path: read-only array view or value} for leaves of the store (see the module doc)."""
        paths = list(paths)
        reply, fds = self._request("get", paths=paths)
        arenas = [Arena.adopt(fd) for fd in fds]
        out: dict[str, Any] = dict(reply["values"])
        for path, (index, offset, shape, dtype) in reply["arrays"].items():
            out[path] = arenas[index].array(offset, shape, np_dtype(dtype))
        return out

    def exists(self, path: str) -> bool:
        return self._call("exists", path=path)

    def walk(self, prefix: str) -> list[str]:
        """Every leaf path under `prefix` (empty when it does not exist)."""
        return self._call("walk", prefix=prefix)

    def rename(self, src: str, dst: str, replace: bool = False) -> None:
        self._call("rename", src=src, dst=dst, replace=replace)

    def delete(self, path: str) -> bool:
        return self._call("delete", path=path)

    # ---- plumbing ---------------------------------------------------------------------
    def _call(self, cmd: str, fds: Sequence[int] = (), **args: Any) -> Any:
        reply, got = self._request(cmd, fds, **args)
        for fd in got:
            os.close(fd)
        return reply

    def _request(self, cmd: str, fds: Sequence[int] = (), **args: Any) -> tuple[Any, list[int]]:
        send(self.sock, {"cmd": cmd, "args": args}, list(fds))
        try:
            got = recv(self.sock)
        except (OSError, ShmError) as e:
            raise ShmError(f"{self.path}: the store did not answer {cmd}: {e}") from None
        if got is None:
            raise ShmError(f"{self.path}: the store closed the connection during {cmd}")
        reply, out = got
        if "err" in reply:
            for fd in out:
                os.close(fd)
            raise ShmError(reply["err"])
        return reply["ok"], out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
