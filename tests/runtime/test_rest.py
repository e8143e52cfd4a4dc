"""REST API: queries per dtype and range against numpy slicing, the reference's round trip
(§9 item 18), uploads, list and delete, one named case per error message (nothing half-written),
token enforcement, and `serve` on a real loopback socket."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import ml_dtypes
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tenplex.runtime.rest import app as rest
from tenplex.runtime.rest import make_app, parse_range, serve
from tenplex.runtime.store.tree import TensorStore

D = "/job/j/t/0"
W = f"{D}/w"  # float32 (4, 4) arange
B = f"{D}/b"  # bfloat16 (2, 3)
M = f"{D}/m"  # bool (5,)
S = f"{D}/s"  # int64 0-d
V = f"{D}/v"  # the value {"a": 1}
ARRAYS = {
    W: np.arange(16, dtype=np.float32).reshape(4, 4),
    B: np.arange(6).astype(ml_dtypes.bfloat16).reshape(2, 3),
    M: np.array([True, False, True, True, False]),
    S: np.array(7, dtype=np.int64),
}


@pytest.fixture
def store():
    s = TensorStore()
    for path, array in ARRAYS.items():
        s.put(path, array)
    s.put(V, {"a": 1})
    return s


def call(store, method, url, params=None, data=None, token=None, headers=None):
    """One request against `make_app(store, token=token)`: (status, headers, body)."""

    async def go():
        async with (
            TestClient(TestServer(make_app(store, token=token))) as client,
            client.request(method, url, params=params, data=data, headers=headers) as r,
        ):
            return r.status, r.headers.copy(), await r.read()

    return asyncio.run(go())


# -- query ---------------------------------------------------------------------------------------

QUERIES = {
    "f32_whole": (W, None, ARRAYS[W]),
    "f32_cols": (W, "[:,2:4]", ARRAYS[W][:, 2:4]),
    "f32_rows_no_brackets": (W, "1:3,:", ARRAYS[W][1:3]),
    "f32_open_ends": (W, "2:,:3", ARRAYS[W][2:, :3]),
    "f32_index_keeps_dim": (W, "1", ARRAYS[W][1:2]),
    "f32_index_both": (W, "3,0", ARRAYS[W][3:4, 0:1]),
    "f32_empty_slice": (W, "4:,:", ARRAYS[W][4:]),
    "bf16_whole": (B, "", ARRAYS[B]),
    "bf16_sub": (B, ":,1:3", ARRAYS[B][:, 1:3]),
    "bool_whole": (M, None, ARRAYS[M]),
    "bool_sub": (M, "1:4", ARRAYS[M][1:4]),
    "scalar_0d": (S, None, ARRAYS[S]),
    "scalar_0d_empty_range": (S, "[]", ARRAYS[S]),
}


@pytest.mark.parametrize("name", QUERIES)
def test_query(store, name):
    path, rng, want = QUERIES[name]
    params = {"path": path} | ({} if rng is None else {"range": rng})
    status, headers, body = call(store, "GET", "/query", params)
    assert status == 200, body
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["X-Tensor-Dtype"] == str(want.dtype)
    assert headers["X-Tensor-Shape"] == ",".join(map(str, want.shape))
    assert body == np.ascontiguousarray(want).tobytes()


def test_query_bf16_header_and_value(store):
    _, headers, body = call(store, "GET", "/query", {"path": B})
    assert headers["X-Tensor-Dtype"] == "bfloat16"
    assert (np.frombuffer(body, ml_dtypes.bfloat16).reshape(2, 3) == ARRAYS[B]).all()
    assert call(store, "GET", "/query", {"path": S})[1]["X-Tensor-Shape"] == ""


def test_query_head_sends_headers_only(store):
    """HEAD answers dtype, shape and length without a body; the connection stays usable."""

    async def go():
        async with TestClient(TestServer(make_app(store))) as client:
            async with client.head("/query", params={"path": W, "range": "1:3"}) as r:
                head = r.status, r.headers["X-Tensor-Shape"], r.headers["Content-Length"], await r.read()
            async with client.get("/query", params={"path": W, "range": "1:3"}) as r:
                return head, await r.read()

    head, body = asyncio.run(go())
    assert head == (200, "2,4", "32", b"")
    assert body == ARRAYS[W][1:3].tobytes()


def test_query_value_as_json(store):
    status, headers, body = call(store, "GET", "/query", {"path": V})
    assert (status, headers["Content-Type"].split(";")[0], body) == (200, "application/json", b'{"a": 1}')


@pytest.mark.parametrize("rng", ["2:6", ":,1:2", ":,3:37", "1:7,5:6"])
def test_query_streams_in_chunks(store, monkeypatch, rng):
    """Tiny chunks exercise the contiguous, row-block and per-row paths of `_chunks`."""
    monkeypatch.setattr(rest, "CHUNK_BYTES", 64)
    big = np.arange(8 * 40, dtype=np.float32).reshape(8, 40)
    store.put("/big", big)
    box = parse_range(rng, big.shape)
    pieces = list(rest._chunks(store.read("/big", box)))
    assert all(len(p) <= 64 for p in pieces)
    status, _, body = call(store, "GET", "/query", {"path": "/big", "range": rng})
    assert status == 200
    assert body == b"".join(pieces) == np.ascontiguousarray(big[box.to_slices()]).tobytes()


def test_reference_round_trip(store):
    """docs/reference-tenplex.md §9 item 18: float16 dims 2,3 with 12 bytes; range :,1:3 gives dims 2,2."""
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    up = {"path": "/p", "dtype": "float16", "shape": "2,3"}
    assert call(store, "POST", "/upload", up, x.tobytes())[0] == 201
    status, headers, body = call(store, "GET", "/query", {"path": "/p", "range": ":,1:3"})
    assert (status, headers["X-Tensor-Shape"], headers["X-Tensor-Dtype"]) == (200, "2,2", "float16")
    assert body == x[:, 1:3].tobytes()
    status, _, body = call(store, "POST", "/upload", up, x.tobytes())
    assert (status, body) == (409, b"path: /p already exists (pass replace=1 to overwrite it)")


# -- upload, list, delete ------------------------------------------------------------------------


@pytest.mark.parametrize("array", [ARRAYS[B], ARRAYS[M], ARRAYS[S], np.zeros((0, 3), np.int32)], ids=str)
def test_upload_round_trip(store, array):
    shape = ",".join(map(str, array.shape))
    params = {"path": "/new/x", "dtype": str(array.dtype), "shape": shape}
    status, _, body = call(store, "POST", "/upload", params, array.tobytes())
    assert status == 201, body
    got = store.get("/new/x")
    assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes()


def test_upload_replace(store):
    params = {"path": W, "dtype": "int8", "shape": "2", "replace": "1"}
    assert call(store, "POST", "/upload", params, b"\x01\x02")[0] == 201
    assert store.get(W).tolist() == [1, 2]


def test_upload_chunked_body(store):
    """Without Content-Length the streamed body is still counted exactly; a shape too large to
    allocate is a 413."""

    async def body(n):
        for _ in range(n):
            yield b"\0" * 8

    params = {"path": "/c", "dtype": "float64", "shape": "3"}
    status, _, text = call(store, "POST", "/upload", params, body(4))
    assert (status, text) == (400, b"body: more than 24 bytes, but dtype and shape need 24")
    assert not store.exists("/c")
    assert call(store, "POST", "/upload", params, body(3))[0] == 201
    assert store.get("/c").tolist() == [0.0, 0.0, 0.0]
    huge = params | {"path": "/huge", "shape": "1000000,1000000,1000000"}
    status, _, text = call(store, "POST", "/upload", huge, body(1))
    assert (status, text) == (413, b"shape: (1000000, 1000000, 1000000) of float64 (8000000000000000000 bytes) is too large")


def test_list(store):
    assert call(store, "GET", "/list", {"path": D})[2] == b'["b", "m", "s", "v", "w"]'
    assert call(store, "GET", "/list")[2] == b'["job"]'


def test_delete(store):
    assert call(store, "DELETE", "/delete", {"path": W})[0] == 200
    assert not store.exists(W) and store.exists(B)
    assert call(store, "DELETE", "/delete", {"path": "/job"})[0] == 200
    assert store.list("/") == []


# -- errors --------------------------------------------------------------------------------------

F32 = {"path": "/u", "dtype": "float32", "shape": "3"}
ERRORS = {  # name: (method, endpoint, params, body, status, message)
    "path_missing": ("GET", "/query", {}, None, 400, "path: missing parameter"),
    "path_relative": ("GET", "/query", {"path": "job/j"}, None, 400, "path: store path 'job/j' is not an absolute"),
    "path_dotdot": ("GET", "/query", {"path": "/job/../etc"}, None, 400, "has an invalid component '..'"),
    "path_backslash": ("GET", "/query", {"path": "/job\\j"}, None, 400, "invalid component 'job\\\\j'"),
    "path_nul": ("GET", "/query", {"path": "/job/\0"}, None, 400, "invalid component '\\x00'"),
    "path_empty_component": ("GET", "/list", {"path": "/job//j"}, None, 400, "invalid component ''"),
    "param_unknown": ("GET", "/query", {"path": W, "dims": "1"}, None, 400, "dims: unknown parameter (expected path, range)"),
    "query_missing": ("GET", "/query", {"path": "/nope"}, None, 404, "path: /nope does not exist"),
    "query_directory": ("GET", "/query", {"path": D}, None, 400, f"path: {D} is a directory, not a leaf"),
    "range_step": ("GET", "/query", {"path": W, "range": "::2"}, None, 400, "range: bad piece '::2' in '::2': steps are not supported"),
    "range_negative": ("GET", "/query", {"path": W, "range": "-1:"}, None, 400, "negative indices are not supported"),
    "range_garbage": ("GET", "/query", {"path": W, "range": "a:b"}, None, 400, "range: bad piece 'a:b' in 'a:b': expected a:b, a:, :b, : or an index"),
    "range_reversed": ("GET", "/query", {"path": W, "range": "3:1"}, None, 400, "range: piece '3:1' in '3:1' is reversed (3 > 1)"),
    "range_too_many": ("GET", "/query", {"path": W, "range": "1,1,1"}, None, 416, "range: '1,1,1' has 3 pieces but the tensor has shape (4, 4)"),
    "range_0d": ("GET", "/query", {"path": S, "range": "0"}, None, 416, "has 1 pieces but the tensor has shape ()"),
    "range_stop_out": ("GET", "/query", {"path": W, "range": ":,2:5"}, None, 416, "range: piece '2:5' of ':,2:5' is outside dim 1 of size 4"),
    "range_start_out": ("GET", "/query", {"path": W, "range": "5:"}, None, 416, "piece '5:' of '5:' is outside dim 0 of size 4"),
    "range_index_out": ("GET", "/query", {"path": W, "range": "4"}, None, 416, "piece '4' of '4' is outside dim 0"),
    "range_on_value": ("GET", "/query", {"path": V, "range": ":"}, None, 400, f"range: {V} holds a value, not an array"),
    "range_5000_digits": ("GET", "/query", {"path": W, "range": "9" * 5000}, None, 400, "range: piece '99999999999999999999...' in '99999999999999999999...' has a number above 2**62"),
    "range_5000_digit_stop": ("GET", "/query", {"path": W, "range": ":" + "1" * 5000}, None, 400, "has a number above 2**62"),
    "range_above_2_62": ("GET", "/query", {"path": W, "range": f"{(1 << 62) + 1}:"}, None, 400, "range: piece '4611686018427387905:' in '4611686018427387905:' has a number above 2**62"),
    "range_big_in_bounds_is_416": ("GET", "/query", {"path": W, "range": f"{1 << 62}"}, None, 416, "is outside dim 0 of size 4"),
    "dtype_missing": ("POST", "/upload", {"path": "/u", "shape": "3"}, b"", 400, "dtype: missing parameter"),
    "dtype_unknown": ("POST", "/upload", F32 | {"dtype": "float17"}, b"", 400, "dtype: 'float17' is not a supported numeric dtype"),
    "dtype_object": ("POST", "/upload", F32 | {"dtype": "object"}, b"", 400, "dtype: 'object' is not a supported"),
    "dtype_big_endian": ("POST", "/upload", F32 | {"dtype": ">f4"}, b"", 400, "dtype: '>f4' is not a supported"),
    "shape_missing": ("POST", "/upload", {"path": "/u", "dtype": "int8"}, b"", 400, "shape: missing parameter"),
    "shape_negative": ("POST", "/upload", F32 | {"shape": "2,-3"}, b"", 400, "shape: '2,-3' is not a comma-separated list"),
    "shape_garbage": ("POST", "/upload", F32 | {"shape": "2x3"}, b"", 400, "shape: '2x3' is not"),
    "shape_5000_digits": ("POST", "/upload", F32 | {"shape": "9" * 5000}, b"", 400, "shape: dimension 0 of '99999999999999999999...' is above 2**62"),
    "shape_above_2_62": ("POST", "/upload", F32 | {"shape": f"1,{(1 << 62) + 1}"}, b"", 400, "shape: dimension 1 of '1,4611686018427387905' is above 2**62"),
    "shape_too_many_dims": ("POST", "/upload", F32 | {"shape": ",".join(["1"] * 65)}, b"", 400, "shape: '1,1,1,1,1,1,1,1,1,1,...' has 65 dimensions; at most 64"),
    "body_short": ("POST", "/upload", F32, b"\0" * 11, 400, "body: 11 bytes, but dtype and shape need 12"),
    "body_long": ("POST", "/upload", F32, b"\0" * 13, 400, "body: 13 bytes, but dtype and shape need 12"),
    "replace_bad": ("POST", "/upload", F32 | {"replace": "yes"}, b"\0" * 12, 400, "replace: 'yes' is not 0, 1, true or false"),
    "upload_exists": ("POST", "/upload", F32 | {"path": W}, b"\0" * 12, 409, f"path: {W} already exists"),
    "upload_under_leaf": ("POST", "/upload", F32 | {"path": f"{W}/x"}, b"\0" * 12, 409, f"path: {W} is a leaf, so {W}/x cannot be created"),
    "upload_over_dir": ("POST", "/upload", F32 | {"path": D, "replace": "1"}, b"\0" * 12, 409, f"path: {D} is a directory"),
    "upload_traversal": ("POST", "/upload", F32 | {"path": "/a/../b"}, b"\0" * 12, 400, "invalid component '..'"),
    "list_missing": ("GET", "/list", {"path": "/nope"}, None, 404, "path: /nope does not exist"),
    "list_leaf": ("GET", "/list", {"path": W}, None, 400, f"path: {W} is a leaf, not a directory"),
    "delete_missing": ("DELETE", "/delete", {"path": "/nope/x"}, None, 404, "path: /nope/x does not exist (no /nope)"),
    "delete_root": ("DELETE", "/delete", {"path": "/"}, None, 400, "path: refusing to delete the root /"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_error(store, name):
    method, url, params, body, want_status, want = ERRORS[name]
    before = {p: store.meta(p) for p in store.walk("/")}
    status, headers, text = call(store, method, url, params, body)
    message = text.decode()
    assert (status, headers["Content-Type"].split(";")[0]) == (want_status, "text/plain"), message
    assert want in message and "\n" not in message.strip()
    assert {p: store.meta(p) for p in store.walk("/")} == before  # nothing half-written


# -- token and serve -----------------------------------------------------------------------------


def test_token(store):
    ok = {"Authorization": "Bearer s3cret"}
    assert call(store, "GET", "/list", token="s3cret", headers=ok)[0] == 200
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        status, got, body = call(store, "GET", "/list", token="s3cret", headers=headers)
        assert (status, body, got["WWW-Authenticate"]) == (401, b"Authorization: missing or wrong bearer token", "Bearer")
    with pytest.raises(ValueError, match="token must be a non-empty string"):
        make_app(store, token="")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com", ""])
def test_serve_refuses_non_loopback_without_token(store, host):
    with pytest.raises(ValueError, match=f"host: refusing to serve the store on non-loopback {host!r} without a token"):
        serve(store, host=host)


def test_serve_real_socket(store):
    with serve(store, token="t") as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        req = urllib.request.Request(f"{server.url}/query?path={W}&range=1:3,2:4", headers={"Authorization": "Bearer t"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert (r.headers["X-Tensor-Shape"], r.read()) == ("2,2", ARRAYS[W][1:3, 2:4].tobytes())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.url}/list", timeout=10)
        assert err.value.code == 401
    server.stop()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/list", timeout=10)


def test_serve_port_in_use(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            serve(store, port=taken.getsockname()[1])
