"""TensorStore: one test per error message, round trips per dtype, zero-copy reads, spill,
rename semantics, a thread smoke test, and box reads against numpy slicing."""

from __future__ import annotations

import glob
import os
import tempfile
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.ir.box import Box
from tenplex.ir.errors import TenplexError
from tenplex.runtime.store.tree import StoreError, TensorStore
from tests.strategies import boxes_in, shapes

W = "/job/j/t/0/w"  # a float32 (4, 4) arange
STEP = "/job/j/t/0/step"  # the value 7


@pytest.fixture
def store():
    s = TensorStore()
    s.put(W, np.arange(16, dtype=np.float32).reshape(4, 4))
    s.put(STEP, 7)
    yield s
    s.close()


def _spill_files(root) -> list[str]:
    return sorted(glob.glob(os.path.join(str(root), "**", "*.npy"), recursive=True))


# -- errors: one case per message ------------------------------------------------------------

B22 = Box((0, 0), (2, 2))
ERRORS = {
    "missing": (lambda s: s.get("/job/j/t/0/nope"), "/job/j/t/0/nope does not exist (no /job/j/t/0/nope)"),
    "missing_dir": (lambda s: s.list("/job/k"), "/job/k does not exist (no /job/k)"),
    "relative": (lambda s: s.get("job/j"), "store path 'job/j' is not an absolute path"),
    "dotdot": (lambda s: s.put("/job/../x", 1), "store path '/job/../x' has an invalid component '..'"),
    "dot": (lambda s: s.exists("/job/./x"), "store path '/job/./x' has an invalid component '.'"),
    "empty_component": (lambda s: s.put("/job//x", 1), "store path '/job//x' has an invalid component ''"),
    "trailing_slash": (lambda s: s.get("/job/"), "store path '/job/' has an invalid component ''"),
    "nul": (lambda s: s.put("/job/x\0y", 1), "has an invalid component 'x\\x00y'"),
    "backslash": (lambda s: s.put("/job/x\\y", 1), "has an invalid component 'x\\\\y'"),
    "not_str": (lambda s: s.get(b"/job"), "store path b'/job' is not an absolute path"),
    "put_existing": (lambda s: s.put(W, np.zeros(1)), f"{W} already exists (pass replace=True to overwrite it)"),
    "put_existing_value": (lambda s: s.put(STEP, 8), f"{STEP} already exists"),
    "create_existing": (lambda s: s.create(W, (1,), "float32"), f"{W} already exists"),
    "put_under_leaf": (lambda s: s.put(W + "/x", 1), f"{W} is a leaf, so {W}/x cannot be created under it"),
    "get_under_leaf": (lambda s: s.get(W + "/x"), f"{W} is a leaf, not a directory, so {W}/x does not exist"),
    "list_leaf": (lambda s: s.list(W), f"{W} is a leaf, not a directory"),
    "get_dir": (lambda s: s.get("/job/j"), "/job/j is a directory, not a leaf"),
    "put_over_dir": (lambda s: s.put("/job/j", 1, replace=True), "/job/j is a directory, not a leaf"),
    "put_root": (lambda s: s.put("/", 1), "the root / is a directory and cannot hold a leaf"),
    "box_outside": (lambda s: s.read(W, Box((0, 0), (6, 4))), f"box [[0, 6], [0, 4]] is outside the array {W} of shape (4, 4)"),
    "box_ndim": (lambda s: s.read(W, Box((0,), (2,))), f"box [[0, 2]] is outside the array {W} of shape (4, 4)"),
    "write_outside": (lambda s: s.write(W, Box((3, 3), (5, 5)), np.zeros((2, 2), np.float32)), "box [[3, 5], [3, 5]] is outside"),
    "read_value": (lambda s: s.read(STEP, Box((), ())), f"{STEP} holds a value, not an array"),
    "write_dtype": (lambda s: s.write(W, B22, np.zeros((2, 2))), f"write to {W} box [[0, 2], [0, 2]] needs float32 of shape (2, 2), got ndarray float64 (2, 2)"),
    "write_shape": (lambda s: s.write(W, B22, np.zeros((2, 3), np.float32)), "needs float32 of shape (2, 2), got ndarray float32 (2, 3)"),
    "write_list": (lambda s: s.write(W, B22, [[0, 0], [0, 0]]), "needs float32 of shape (2, 2), got list"),
    "value_object": (lambda s: s.put("/x", object()), "value for /x contains <object object"),
    "value_tuple": (lambda s: s.put("/x", [1, (2, 3)]), "value for /x contains (2, 3) of type tuple, which is neither a numpy array nor JSON-able"),
    "value_int_key": (lambda s: s.put("/x", {1: 2}), "value for /x has a dict key 1 that is not a str"),
    "object_array": (lambda s: s.put("/x", np.array([None])), "array for /x has dtype object; object arrays cannot be stored"),
    "negative_shape": (lambda s: s.create("/x", (2, -1), "float32"), "shape (2, -1) for /x has a negative side"),
    "float_shape": (lambda s: s.create("/x", (2.5,), "float32"), "shape (2.5,) for /x is not a sequence of integers"),
    "rename_missing": (lambda s: s.rename("/job/k", "/job/m"), "/job/k does not exist"),
    "rename_root": (lambda s: s.rename("/", "/x"), "cannot rename / to /x: the root cannot move"),
    "rename_into_self": (lambda s: s.rename("/job/j", "/job/j/t/new"), "cannot rename /job/j to /job/j/t/new"),
    "rename_onto_parent": (lambda s: s.rename("/job/j/t", "/job", replace=True), "cannot rename /job/j/t to /job"),
    "rename_dst_exists": (lambda s: s.rename(W, STEP), f"{STEP} already exists (pass replace=True"),
    "rename_under_leaf": (lambda s: s.rename(STEP, W + "/x"), f"{W} is a leaf, so {W}/x cannot be created under it"),
    "delete_missing": (lambda s: s.delete("/job/k"), "/job/k does not exist"),
    "over_budget": (lambda s: TensorStore(16).put("/x", np.zeros(4, np.float64)), "/x needs 32 bytes but 0 of the 16-byte memory budget are in use and the store has no spill_dir"),
    "negative_budget": (lambda s: TensorStore(-1), "memory_budget_bytes -1 is negative"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_messages(store, name):
    call, message = ERRORS[name]
    before = {p: store.meta(p) for p in store.walk()}
    with pytest.raises(StoreError) as info:
        call(store)
    assert message in str(info.value)
    assert isinstance(info.value, TenplexError)
    assert {p: store.meta(p) for p in store.walk()} == before  # nothing half-done


def test_over_budget_put_leaves_the_old_leaf():
    s = TensorStore(16)
    s.put("/x", np.zeros(2, np.float32))
    with pytest.raises(StoreError, match="needs 32 bytes but 0 of the 16-byte"):  # the replaced leaf is freed first
        s.put("/x", np.zeros(4, np.float64), replace=True)
    assert s.get("/x").dtype == np.float32 and s.resident_nbytes == 8


# -- round trips -----------------------------------------------------------------------------

ARRAYS = {
    "float32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "bfloat16": np.arange(5).astype(ml_dtypes.bfloat16),
    "float8": np.arange(4).astype(ml_dtypes.float8_e4m3fn),
    "bool": np.array([True, False, True]),
    "int64": np.arange(-3, 3, dtype=np.int64),
    "scalar_0d": np.array(2.5, dtype=np.float64),
    "empty_2d": np.zeros((0, 3), np.float32),
    "empty_1d": np.zeros((0,), np.uint8),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    "strided": np.arange(10, dtype=np.int16)[::2],
}


@pytest.mark.parametrize("spill", [False, True], ids=["memory", "spilled"])
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_round_trip(tmp_path, name, spill):
    src = ARRAYS[name]
    with TensorStore(0 if spill else None, str(tmp_path)) as s:
        s.put("/a", src)
        src_copy = src.copy()
        out = s.get("/a")
        assert out.dtype == src.dtype and out.shape == src.shape
        assert out.tobytes() == src_copy.tobytes()
        assert not out.flags.writeable
        assert not np.shares_memory(out, src)  # copied in
        meta = s.meta("/a")
        assert (meta.kind, meta.shape, meta.dtype, meta.nbytes) == ("array", src.shape, str(src.dtype), src.nbytes)
        assert meta.spilled == (spill and src.nbytes > 0)
        assert s.resident_nbytes == (0 if spill else src.nbytes)


@pytest.mark.parametrize("value", [None, True, 0, -3, 2.5, "text", [], [1, [2, None]], {"a": {"b": [False, "x"]}}])
def test_value_round_trip(value):
    s = TensorStore()
    s.put("/v", value)
    out = s.get("/v")
    assert out == value and type(out) is type(value)
    assert s.meta("/v").kind == "value" and s.nbytes("/") == 0
    if isinstance(out, (list, dict)):
        out.clear()  # a copy: the store keeps its own
        assert s.get("/v") == value


def test_numpy_scalar_is_a_0d_array():
    s = TensorStore()
    s.put("/x", np.float32(1.5))
    assert s.meta("/x").shape == () and s.get("/x").dtype == np.float32


def test_replace_and_adopt():
    s = TensorStore()
    a = np.ones(3, np.int32)
    s.put("/x", 1)
    s.put("/x", a, replace=True, copy=False)
    assert np.shares_memory(s.get("/x"), a) and s.resident_nbytes == 12
    s.put("/x", "v", replace=True)
    assert s.get("/x") == "v" and s.resident_nbytes == 0


# -- zero-copy reads and writes --------------------------------------------------------------


def test_read_is_a_view_that_sees_writes(store):
    box = Box((1, 1), (3, 4))
    part = store.read(W, box)
    assert np.shares_memory(part, store.get(W))
    assert not part.flags.writeable
    with pytest.raises(ValueError):
        part[0, 0] = 1
    store.write(W, Box((2, 2), (3, 4)), np.array([[-1, -2]], np.float32))
    assert part.tolist() == [[5, 6, 7], [9, -1, -2]]
    store.read(W, Box((0, 0), (1, 1)), writable=True)[...] = 99
    assert store.get(W)[0, 0] == 99


def test_create_then_write_boxes():
    s = TensorStore()
    s.create("/dst", (2, 4), "bfloat16")
    assert s.get("/dst").dtype == ml_dtypes.bfloat16 and not s.get("/dst").any()
    s.write("/dst", Box((0, 0), (2, 2)), np.ones((2, 2), ml_dtypes.bfloat16))
    s.write("/dst", Box((0, 2), (2, 4)), np.full((2, 2), 2, ml_dtypes.bfloat16))
    assert s.get("/dst").astype(np.float32).tolist() == [[1, 1, 2, 2], [1, 1, 2, 2]]


@given(st.data())
def test_read_equals_numpy_slicing(data):
    shape = data.draw(shapes(max_ndim=3, max_side=6))
    dtype = data.draw(st.sampled_from([np.float32, np.int8, np.bool_, ml_dtypes.bfloat16]))
    array = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
    box = data.draw(boxes_in(shape))
    spill = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as root, TensorStore(0 if spill else None, root) as s:
        s.put("/t", array)
        got = s.read("/t", box)
        assert got.dtype == array.dtype and got.shape == box.shape
        assert got.tobytes() == array[box.to_slices()].tobytes()
        if box.volume:
            assert np.shares_memory(got, s.get("/t"))


# -- tree: list, walk, delete, rename, accounting --------------------------------------------


def test_list_walk_nbytes_delete(store):
    store.put("/job/j/t/1/w", np.zeros(3, np.float64))
    assert store.list("/") == ["job"] and store.list("/job/j/t") == ["0", "1"]
    assert store.list("/job/j/t/0") == ["step", "w"]
    assert store.walk("/job/j") == [STEP, W, "/job/j/t/1/w"]
    assert store.walk(W) == [W]
    assert store.nbytes("/") == 64 + 24 and store.nbytes("/job/j/t/1") == 24 and store.nbytes(STEP) == 0
    assert store.exists("/job/j/t") and not store.exists(W + "/x") and not store.exists("/nope")
    store.delete("/job/j/t/0")
    assert store.walk("/") == ["/job/j/t/1/w"] and store.resident_nbytes == 24
    store.delete("/")
    assert store.list("/") == [] and store.resident_nbytes == 0


def test_rename_moves_a_subtree(tmp_path):
    with TensorStore(0, str(tmp_path)) as s:  # everything spilled: files must follow
        s.put("/job/j/tmp/0/w", np.arange(4.0))
        s.put("/job/j/tmp/0/step", 3)
        s.put("/job/j/dst/0/old", np.arange(2.0))
        assert len(_spill_files(tmp_path)) == 2
        with pytest.raises(StoreError, match="/job/j/dst already exists"):
            s.rename("/job/j/tmp", "/job/j/dst")
        assert s.walk("/") == ["/job/j/dst/0/old", "/job/j/tmp/0/step", "/job/j/tmp/0/w"]
        s.rename("/job/j/tmp", "/job/j/dst", replace=True)
        assert s.walk("/") == ["/job/j/dst/0/step", "/job/j/dst/0/w"]
        assert s.get("/job/j/dst/0/w").tolist() == [0, 1, 2, 3]
        assert len(_spill_files(tmp_path)) == 1  # the replaced subtree's file is gone
        s.rename("/job/j/dst/0/w", "/job/k/w")  # leaves move too; parents are created
        assert s.get("/job/k/w").tolist() == [0, 1, 2, 3]


def test_rename_is_atomic_for_readers():
    s = TensorStore()
    for i in range(20):
        s.put(f"/job/j/a/{i}", np.full(2, i))
    stop, seen = threading.Event(), []

    def reader():
        while not stop.is_set():
            seen.append({p.split("/")[3] for p in s.walk("/")})

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(200):
        s.rename("/job/j/a" if i % 2 == 0 else "/job/j/b", "/job/j/b" if i % 2 == 0 else "/job/j/a")
    stop.set()
    thread.join()
    assert seen and all(tags in ({"a"}, {"b"}) for tags in seen)


# -- spill -----------------------------------------------------------------------------------


def test_spill_least_recently_used(tmp_path):
    s = TensorStore(100, str(tmp_path))
    a, b, c = (np.full(10, i, np.float32) for i in range(3))  # 40 bytes each
    s.put("/a", a)
    s.put("/b", b)
    s.get("/a")  # /b is now least recently used
    s.put("/c", c)
    assert [s.meta(p).spilled for p in ("/a", "/b", "/c")] == [False, True, False]
    assert s.resident_nbytes == 80 and s.nbytes() == 120 and len(_spill_files(tmp_path)) == 1
    assert s.get("/b").tobytes() == b.tobytes() and isinstance(s.get("/b"), np.memmap)
    s.write("/b", Box((0,), (2,)), np.array([7, 8], np.float32))  # spilled arrays stay writable
    assert s.read("/b", Box((0,), (3,))).tolist() == [7, 8, 1]
    s.put("/big", np.zeros(30, np.float32))  # over the whole budget: straight to disk
    assert s.meta("/big").spilled and not s.meta("/a").spilled
    s.create("/big2", (30,), np.float32)
    assert s.meta("/big2").spilled and not s.get("/big2").any()
    s.delete("/b")
    assert len(_spill_files(tmp_path)) == 2
    s.close()
    assert os.listdir(tmp_path) == []


def test_replacing_a_spilled_leaf_removes_its_file(tmp_path):
    with TensorStore(0, str(tmp_path)) as s:
        s.put("/x", np.ones(4))
        s.put("/x", np.zeros(4), replace=True)
        assert len(_spill_files(tmp_path)) == 1 and not s.get("/x").any()


# -- threads ---------------------------------------------------------------------------------


def test_threads_put_read_delete(tmp_path):
    s = TensorStore(4000, str(tmp_path))
    errors = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                path = f"/job/j/t/{t}/{i}"
                s.put(path, np.full(25, t * 1000 + i, np.int32))
                assert s.read(path, Box((3,), (5,))).tolist() == [t * 1000 + i] * 2
                if i % 2:
                    s.delete(path)
        except Exception as e:  # surfaced below; a thread's assert would be lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(s.walk("/")) == 8 * 20 and s.nbytes() == 8 * 20 * 100 and s.resident_nbytes <= 4000
    s.close()
    assert os.listdir(tmp_path) == []
