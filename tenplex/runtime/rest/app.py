"""The paper's REST API over a `TensorStore` (aiohttp): query sub-tensors, upload, list, delete.

Endpoints (every parameter is a query parameter; unknown parameters are rejected):
- `GET /query?path=P[&range=R]` (or HEAD, for the headers only): an array's (sub-)tensor as raw C-order bytes with headers
  `X-Tensor-Dtype` (numpy name, e.g. `float32`, `bfloat16`), `X-Tensor-Shape` (`2,3`; empty
  for 0-d) and `Content-Type: application/octet-stream`; a value leaf as JSON.
- `POST /upload?path=P&dtype=D&shape=S[&replace=1]`: the raw body (C order, native byte order)
  becomes the array at P; 409 if P exists and `replace` is not set.
- `GET /list[?path=P]`: JSON list of the child names of directory P (default `/`).
- `DELETE /delete?path=P`: removes the leaf or subtree P (not the root).

`range` syntax: comma-separated pieces, one per leading dimension, optionally in `[...]`; a piece
is `a:b`, `a:`, `:b`, `:` (half-open, non-negative) or an index `i`, which means `i:i+1` and
keeps the dimension (length 1). Missing trailing dimensions are taken whole (as in the
reference). No steps, no negative indices, no clamping: a piece outside the shape is a 416.

Errors are 4xx with a one-line `text/plain` message that starts with the parameter at fault:
400 malformed input (path traversal, syntax, dtype, shape, body length), 401 bad token,
404 missing path, 409 clash with the store (exists, under a leaf, over its memory budget),
413 a shape too large to allocate, 416 range outside the tensor.

Invariants:
- `/query` reads through `TensorStore.read(path, box)`: never more than the box, streamed in
  chunks of at most `CHUNK_BYTES` (a non-contiguous box is copied chunk by chunk);
- a failed `/upload` stores nothing: the body is read in full and checked before one `put`;
- with a token, every request without `Authorization: Bearer <token>` gets 401;
- `serve` binds to a non-loopback host only with a token.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import math
import re
import threading
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
from aiohttp import web

from tenplex.ir.box import Box
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.store.leaf import parse_path
from tenplex.runtime.store.tree import StoreError, TensorStore

__all__ = ["CHUNK_BYTES", "RangeError", "RestServer", "make_app", "parse_range", "serve"]

CHUNK_BYTES = 4 << 20
_PIECE = re.compile(r"\s*(?:(?P<index>\d+)|(?P<start>\d*)\s*:\s*(?P<stop>\d*))\s*", re.ASCII)
_EXTRA_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # ml_dtypes, as in arrays.np_dtype
_STORE_KEY = web.AppKey("store", TensorStore)


class RangeError(ValueError):
    """A `range` that is malformed (`status` 400) or outside the tensor (`status` 416)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse_range(text: str, shape: tuple[int, ...]) -> Box:
    """The box that `text` (see module doc) selects in an array of `shape`.

    Raises: RangeError (400) for bad syntax, steps, negative or reversed pieces; (416) for more
    pieces than dimensions or a piece outside its dimension.
    """
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    pieces = body.split(",") if body.strip() else []
    if len(pieces) > len(shape):
        raise RangeError(f"range: {text!r} has {len(pieces)} pieces but the tensor has shape {shape}", 416)
    start, stop = [0] * len(shape), list(shape)
    for d, piece in enumerate(pieces):
        a, b = _piece(piece, text)
        b = shape[d] if b is None else b
        if not a <= b <= shape[d]:
            raise RangeError(f"range: piece {piece.strip()!r} of {text!r} is outside dim {d} of size {shape[d]}", 416)
        start[d], stop[d] = a, b
    return Box(start, stop)


def _piece(piece: str, text: str) -> tuple[int, int | None]:
    m = _PIECE.fullmatch(piece)
    if m is None:
        why = "steps are not supported" if piece.count(":") > 1 else "expected a:b, a:, :b, : or an index"
        why = "negative indices are not supported" if "-" in piece else why
        raise RangeError(f"range: bad piece {piece.strip()!r} in {text!r}: {why}", 400)
    if m["index"] is not None:
        return int(m["index"]), int(m["index"]) + 1
    a = int(m["start"]) if m["start"] else 0
    b = int(m["stop"]) if m["stop"] else None
    if b is not None and a > b:
        raise RangeError(f"range: piece {piece.strip()!r} in {text!r} is reversed ({a} > {b})", 400)
    return a, b


def make_app(store: TensorStore, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving `store`; with `token`, requests need `Bearer <token>`."""
    app = web.Application(middlewares=[bearer_auth(token)] if token is not None else [])
    app[_STORE_KEY] = store
    app.router.add_get("/query", _query)
    app.router.add_post("/upload", _upload)
    app.router.add_get("/list", _list)
    app.router.add_delete("/delete", _delete)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _unauthorized(message: str) -> web.HTTPException:
    return web.HTTPUnauthorized(text=message, headers={"WWW-Authenticate": "Bearer"})


def bearer_auth(token: str, reject: Callable[[str], web.HTTPException] = _unauthorized
                ) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:  # fmt: skip
    """Middleware refusing requests without `Authorization: Bearer <token>` (constant-time
    compare) with `reject(message)`, a 401. Raises ValueError for an empty token."""
    if not token:
        raise ValueError("token must be a non-empty string")
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            raise reject("Authorization: missing or wrong bearer token")
        return await handler(request)

    return check


# -- handlers ----------------------------------------------------------------------------------


async def _query(request: web.Request) -> web.StreamResponse:
    store, path = _store(request), _path(request, {"path", "range"})
    try:
        meta = store.meta(path)
        if meta.kind == "value":
            if "range" in request.query:
                raise _fail(web.HTTPBadRequest, f"range: {path} holds a value, not an array")
            return web.json_response(store.get(path))
        box = _box(request.query.get("range", ""), meta.shape)
        data = store.read(path, box)
    except StoreError as err:
        raise _store_fail(store, path, err, web.HTTPBadRequest) from None
    headers = {"X-Tensor-Dtype": str(data.dtype), "X-Tensor-Shape": ",".join(map(str, data.shape))}
    response = web.StreamResponse(headers=headers)
    response.content_type = "application/octet-stream"
    response.content_length = data.nbytes
    await response.prepare(request)
    if request.method != "HEAD":  # HEAD: the headers alone (dtype, shape, length)
        for chunk in _chunks(data):
            await response.write(chunk)
    await response.write_eof()
    return response


async def _upload(request: web.Request) -> web.Response:
    store, path = _store(request), _path(request, {"path", "dtype", "shape", "replace"})
    dtype, shape, replace = _dtype(request), _shape(request), _flag(request, "replace")
    if not replace and store.exists(path):
        raise _fail(web.HTTPConflict, f"path: {path} already exists (pass replace=1 to overwrite it)")
    nbytes = math.prod(shape) * dtype.itemsize
    if request.content_length is not None and request.content_length != nbytes:
        raise _fail(web.HTTPBadRequest, f"body: {request.content_length} bytes, but dtype and shape need {nbytes}")
    try:
        array = np.empty(shape, dtype)
    except (ValueError, MemoryError):
        message = f"shape: {shape} of {dtype} ({nbytes} bytes) is too large"
        raise _fail(web.HTTPRequestEntityTooLarge, message, max_size=0, actual_size=nbytes) from None
    await _read_body(request, array.reshape(-1).view(np.uint8))
    try:
        store.put(path, array, replace=replace, copy=False)
    except StoreError as err:
        raise _fail(web.HTTPConflict, f"path: {err}") from None
    return web.json_response({"path": path, "dtype": str(dtype), "shape": list(shape)}, status=201)


async def _list(request: web.Request) -> web.Response:
    store = _store(request)
    path = _path(request, {"path"}, default="/")
    try:
        return web.json_response(store.list(path))
    except StoreError as err:
        raise _store_fail(store, path, err, web.HTTPBadRequest) from None


async def _delete(request: web.Request) -> web.Response:
    store, path = _store(request), _path(request, {"path"})
    if path == "/":
        raise _fail(web.HTTPBadRequest, "path: refusing to delete the root /")
    try:
        store.delete(path)
    except StoreError as err:
        raise _store_fail(store, path, err, web.HTTPConflict) from None
    return web.json_response({"deleted": path})


# -- parameters --------------------------------------------------------------------------------


def _fail(kind: type[web.HTTPException], message: str, **kwargs: int) -> web.HTTPException:
    return kind(text=" ".join(message.split()), **kwargs)  # one line, for logs and clients alike


def _store_fail(store: TensorStore, path: str, err: StoreError, other: type[web.HTTPException]) -> web.HTTPException:
    return _fail(web.HTTPNotFound if not store.exists(path) else other, f"path: {err}")


def _store(request: web.Request) -> TensorStore:
    return request.app[_STORE_KEY]


def _path(request: web.Request, allowed: set[str], default: str | None = None) -> str:
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise _fail(web.HTTPBadRequest, f"{unknown[0]}: unknown parameter (expected {', '.join(sorted(allowed))})")
    path = request.query.get("path", default)
    if path is None:
        raise _fail(web.HTTPBadRequest, "path: missing parameter")
    try:
        parse_path(path)
    except StoreError as err:
        raise _fail(web.HTTPBadRequest, f"path: {err}") from None
    return path


def _box(text: str, shape: tuple[int, ...]) -> Box:
    try:
        return parse_range(text, shape)
    except RangeError as err:
        kind = web.HTTPRequestRangeNotSatisfiable if err.status == 416 else web.HTTPBadRequest
        raise _fail(kind, str(err)) from None


def _dtype(request: web.Request) -> np.dtype:
    name = request.query.get("dtype")
    if name is None:
        raise _fail(web.HTTPBadRequest, "dtype: missing parameter")
    try:
        dtype = np_dtype(name)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or not dtype.isnative or not (dtype.kind in "biufc" or str(dtype) in _EXTRA_DTYPES):
        raise _fail(web.HTTPBadRequest, f"dtype: {name!r} is not a supported numeric dtype (e.g. float32, bfloat16, bool)")
    return dtype


def _shape(request: web.Request) -> tuple[int, ...]:
    text = request.query.get("shape")
    if text is None:
        raise _fail(web.HTTPBadRequest, "shape: missing parameter (empty for a 0-d tensor)")
    parts = text.split(",") if text.strip() else []
    if not all(p.strip().isdecimal() and p.strip().isascii() for p in parts):
        raise _fail(web.HTTPBadRequest, f"shape: {text!r} is not a comma-separated list of non-negative integers")
    return tuple(int(p) for p in parts)


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value not in ("0", "1", "true", "false"):
        raise _fail(web.HTTPBadRequest, f"{name}: {value!r} is not 0, 1, true or false")
    return value in ("1", "true")


async def _read_body(request: web.Request, out: np.ndarray) -> None:
    """Fill the flat uint8 `out` with the body, which must have exactly `out.size` bytes."""
    got = 0
    async for chunk in request.content.iter_chunked(CHUNK_BYTES):
        if got + len(chunk) > out.size:
            raise _fail(web.HTTPBadRequest, f"body: more than {out.size} bytes, but dtype and shape need {out.size}")
        out[got : got + len(chunk)] = np.frombuffer(chunk, np.uint8)
        got += len(chunk)
    if got != out.size:
        raise _fail(web.HTTPBadRequest, f"body: {got} bytes, but dtype and shape need {out.size}")


def _chunks(data: np.ndarray) -> Iterator[memoryview]:
    """`data`'s bytes in C order, in pieces of at most CHUNK_BYTES (or one innermost row)."""
    if data.flags.c_contiguous:
        flat = memoryview(data.reshape(-1).view(np.uint8))
        for i in range(0, len(flat), CHUNK_BYTES):
            yield flat[i : i + CHUNK_BYTES]
        return
    row = data.nbytes // data.shape[0]  # not contiguous, so ndim >= 1 and no dimension is 0
    rows = CHUNK_BYTES // row
    if rows == 0:
        for i in range(data.shape[0]):
            yield from _chunks(data[i])
        return
    for i in range(0, data.shape[0], rows):
        yield memoryview(np.ascontiguousarray(data[i : i + rows]).reshape(-1).view(np.uint8))


# -- a server in a thread ----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses (the hosts that may serve without a token)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The server thread: run `loop` until stopped, then close it with its executor's threads."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class RestServer:
    """A running REST server on its own event loop thread; see `serve`.

    `host` and `port` are the bound address (`port` resolved when 0 was asked for); `url` is
    `http://host:port`. `stop()` (or leaving the `with` block) shuts it down, giving in-flight
    requests `shutdown_timeout` seconds, and leaves no thread behind; it is idempotent. Serves any
    aiohttp app (the store's here, a job's scale endpoint in `tenplex.elastic.http`).
    """

    def __init__(self, app: web.Application, host: str, port: int, shutdown_timeout: float = 60.0,
                 name: str = "tenplex-rest") -> None:  # fmt: skip
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_run_loop, args=(self._loop,), name=f"{name}-{host}", daemon=True)
        self._thread.start()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        try:
            self.port = self._call(self._start(host, port))
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def _start(self, host: str, port: int) -> int:
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    def _call(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._runner.cleanup())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()  # _run_loop closes the loop

    def __enter__(self) -> RestServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(store: TensorStore, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> RestServer:
    """Serve `store` on `host:port` from a background thread and return once it is bound.

    Usable from synchronous code (agents, tests, the CLI): `with serve(store) as server: ...`
    with `server.port`/`server.url`. Code already inside an event loop should run
    `make_app(store, token=...)` on its own `web.AppRunner` instead.
    Raises: ValueError if `host` is not loopback and no token is given, or the token is empty;
    OSError if the address cannot be bound.
    """
    if not token and not is_loopback(host):
        raise ValueError(f"host: refusing to serve the store on non-loopback {host!r} without a token (pass token=...)")
    return RestServer(make_app(store, token=token), host, port)

