"""The paper's REST API over a `TensorStore` (aiohttp): query sub-tensors, upload, list, delete.

Endpoints (every parameter is a query parameter; unknown parameters are rejected):
- `GET /query?path=P[&range=R]` (or HEAD, for the headers only): an array's (sub-)tensor as raw C-order bytes with headers
  `X-Tensor-Dtype` (numpy name, e.g. `float32`, `bfloat16`), `X-Tensor-Shape` (`2,3`; empty
  for 0-d) and `Content-Type: application/octet-stream`; a value leaf as JSON.
- `POST /upload?path=P&dtype=D&shape=S[&replace=1]`: the raw body (C order, native byte order)
  becomes the array at P; 409 if P exists and `replace` is not set.
- `GET /list[?path=P]`: JSON list of the child names of directory P (default `/`).
- `DELETE /delete?path=P`: removes the leaf or subtree P (not the root).

`range` syntax (`rest.ranges`): comma-separated pieces `a:b`, `a:`, `:b`, `:` or an index `i`, one
per leading dimension, optionally in `[...]`; missing trailing dimensions are taken whole.

Errors are 4xx with a one-line `text/plain` message that starts with the parameter at fault:
400 malformed input (path traversal, syntax, dtype, shape, body length; a number in `range` or
`shape` above 2**62, more than 64 dimensions), 401 bad token,
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

import math
from collections.abc import Iterator

import numpy as np
from aiohttp import web

from tenplex.ir.box import Box
from tenplex.runtime.arrays import EXTRA_DTYPES, np_dtype
from tenplex.runtime.rest.ranges import MAX_INDEX, RangeError, parse_range, short
from tenplex.runtime.rest.server import RestServer, bearer_auth, is_loopback
from tenplex.runtime.store.leaf import parse_path
from tenplex.runtime.store.tree import StoreError, TensorStore

__all__ = ["CHUNK_BYTES", "make_app", "serve"]

CHUNK_BYTES = 4 << 20
MAX_NDIM = 64  # numpy's own limit
_STORE_KEY = web.AppKey("store", TensorStore)


def make_app(store: TensorStore, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving `store`; with `token`, requests need `Bearer <token>`."""
    app = web.Application(middlewares=[bearer_auth(token)] if token is not None else [])
    app[_STORE_KEY] = store
    app.router.add_get("/query", _query)
    app.router.add_post("/upload", _upload)
    app.router.add_get("/list", _list)
    app.router.add_delete("/delete", _delete)
    return app


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
    if dtype is None or not dtype.isnative or not (dtype.kind in "biufc" or str(dtype) in EXTRA_DTYPES):
        raise _fail(web.HTTPBadRequest, f"dtype: {short(name)!r} is not a supported numeric dtype (e.g. float32, bfloat16, bool)")
    return dtype


def _shape(request: web.Request) -> tuple[int, ...]:
    text = request.query.get("shape")
    if text is None:
        raise _fail(web.HTTPBadRequest, "shape: missing parameter (empty for a 0-d tensor)")
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not all(p.isdecimal() and p.isascii() for p in parts):
        raise _fail(web.HTTPBadRequest, f"shape: {short(text)!r} is not a comma-separated list of non-negative integers")
    if len(parts) > MAX_NDIM:
        raise _fail(web.HTTPBadRequest, f"shape: {short(text)!r} has {len(parts)} dimensions; at most {MAX_NDIM}")
    for d, p in enumerate(parts):  # checked by length first: int() stops at 4300 digits
        if len(p.lstrip("0")) > 19 or int(p) > MAX_INDEX:
            raise _fail(web.HTTPBadRequest, f"shape: dimension {d} of {short(text)!r} is above 2**62")
    return tuple(int(p) for p in parts)


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value not in ("0", "1", "true", "false"):
        raise _fail(web.HTTPBadRequest, f"{name}: {short(value)!r} is not 0, 1, true or false")
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

