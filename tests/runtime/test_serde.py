"""tenplex.runtime.checkpoint (save, load): exact round trips, the on-disk tree, sharing, atomicity and errors."""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.runtime.checkpoint import MANIFEST, SerdeError, load, save

Point = collections.namedtuple("Point", ["x", "y"])


def assert_same(a, b, where="state"):
    """Exact equality: types of every container, key and leaf, dtypes, shapes and bytes."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for (ka, va), kb in zip(a.items(), b):
            assert_same(ka, kb, f"{where} key {ka!r}")
            assert_same(va, b[kb], f"{where}[{ka!r}]")
    elif isinstance(a, argparse.Namespace):
        assert_same(vars(a), vars(b), where)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), where
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b), where
    elif type(a).__module__.startswith("torch") and type(a).__name__ in ("Tensor", "Parameter"):
        assert (a.dtype, a.shape, a.requires_grad, a.device) == (b.dtype, b.shape, b.requires_grad, b.device), where
        assert _bits(a) == _bits(b), where
    elif isinstance(a, np.generic):
        assert (a.dtype, a.tobytes()) == (b.dtype, b.tobytes()), where
    else:
        assert a == b, where


def _bits(t):
    import torch

    flat = t.detach().resolve_conj().contiguous().view(-1)
    return flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[t.element_size()]).tolist()


def roundtrip(state, tmp_path):
    save(state, tmp_path / "ckpt")
    out = load(tmp_path / "ckpt")
    assert_same(state, out)
    return out


def test_python_and_numpy_roundtrip(tmp_path):
    state = {
        "ints": {0: 1, -5: 2**80, 3: -7},
        "mixed_keys": {1: "a", "1": "b", 2.5: None, False: b"\x00\xff", None: 1.5, (1, "x"): [], b"k": ()},
        "floats": [math.nan, -math.nan, struct.unpack(">d", bytes.fromhex("7ff0000000000123"))[0], math.inf, -math.inf, -0.0, 1e-310, 0.1],
        "complex": complex(1.5, -math.inf),
        "bools": (True, False),
        "nested": [(1, [2, (3,)]), {}, [], (), ""],
        "od": collections.OrderedDict([("b", 1), ("a", 2)]),
        "point": Point(1, np.arange(3)),
        "ns": argparse.Namespace(lr=0.1, layers=[1, 2]),
        "np_scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), ml_dtypes.bfloat16(2.5)],
        "arrays": [np.zeros((0, 3), np.float16), np.array(7, np.int8), np.arange(6, dtype=">i4").reshape(2, 3)],
        "bf16": np.arange(5).astype(ml_dtypes.bfloat16),
        "f8": np.arange(4).astype(ml_dtypes.float8_e4m3fn),
        "strided": np.arange(24.0).reshape(4, 6)[::2, 1::3].T,
        "strs": "ünïcode / ../ \n",
    }
    roundtrip(state, tmp_path)


def test_leaf_roots_and_empty(tmp_path):
    for i, state in enumerate([None, 3, [], {}, np.ones(2)]):
        save(state, tmp_path / f"s{i}")
        assert_same(state, load(tmp_path / f"s{i}"))


def test_every_npy_is_plain_and_matches(tmp_path):
    state = {"model": {"w": np.arange(6.0).reshape(2, 3), "b16": np.ones(3, ml_dtypes.bfloat16)}, "opt": [np.int32(1), np.array([True, False])]}
    save(state, tmp_path / "c")
    root = json.loads((tmp_path / "c" / MANIFEST).read_text())["root"]
    assert np.array_equal(np.load(tmp_path / "c/model/w.npy"), state["model"]["w"])
    b16 = np.load(tmp_path / "c/model/b16.npy")  # its header names bfloat16 (tests/runtime/test_npy_dtypes.py)
    assert b16.dtype == ml_dtypes.bfloat16 and np.array_equal(b16, state["model"]["b16"])
    assert np.array_equal(np.load(tmp_path / "c/opt/1.npy"), state["opt"][1])
    assert root["items"][0][1]["items"][1][1] == {"type": "ndarray", "file": "model/b16.npy", "dtype": "bfloat16", "shape": [3]}
    assert sorted(p.relative_to(tmp_path / "c").as_posix() for p in (tmp_path / "c").rglob("*.npy")) == ["model/b16.npy", "model/w.npy", "opt/1.npy"]


def test_file_names_escape_and_never_collide(tmp_path):
    state = {"a/b": np.ones(1), "..": {"x": np.ones(2)}, 1: np.ones(3), "1": np.ones(4), "w.npy": {"q": np.ones(5)}, "w": np.ones(6), "state.json": {"z": np.ones(7)}}
    out = roundtrip(state, tmp_path)
    names = sorted(p.relative_to(tmp_path / "ckpt").as_posix() for p in (tmp_path / "ckpt").rglob("*.npy") if p.is_file())
    assert names == ["1.npy", "1~2.npy", "_../x.npy", "a%2Fb.npy", "state.json~2/z.npy", "w.npy/q.npy", "w~2.npy"]
    assert out[1].shape == (3,) and out["1"].shape == (4,)


def test_shared_arrays_saved_once_and_restored_shared(tmp_path):
    a = np.arange(4)
    out = roundtrip({"x": a, "y": [a], "z": a.copy()}, tmp_path)
    assert out["x"] is out["y"][0] and out["z"] is not out["x"]
    assert len(list((tmp_path / "ckpt").rglob("*.npy"))) == 2


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"optimizer": {"state": {3: {"exp_avg": lambda: 0}}}}, r"state\['optimizer'\]\['state'\]\[3\]\['exp_avg'\]: unsupported type builtins.function"),
        ({"a": [1, object()]}, r"state\['a'\]\[1\]: unsupported type builtins.object"),
        ({"a": {frozenset(): 1}}, r"unsupported key type frozenset"),
        ({"a": np.array(["s"])}, r"state\['a'\]: unsupported dtype <U1"),
        ({"a": np.array([None])}, r"unsupported dtype object"),
        ({"a": {1, 2}}, r"unsupported type builtins.set"),
    ],
)
def test_unsupported_values_name_the_key_path(tmp_path, state, message):
    with pytest.raises(SerdeError, match=message):
        save(state, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_cycle_is_an_error(tmp_path):
    loop = []
    loop.append(loop)
    with pytest.raises(SerdeError, match=r"state\[0\]\[0\] contains itself"):
        save([loop], tmp_path / "c")


def test_failed_save_leaves_existing_tree_intact(tmp_path):
    save({"w": np.ones(3)}, tmp_path / "c")
    with pytest.raises(SerdeError, match="unsupported type"):
        save({"w": np.zeros(3), "bad": print}, tmp_path / "c")
    assert list(tmp_path.iterdir()) == [tmp_path / "c"]
    assert_same(load(tmp_path / "c"), {"w": np.ones(3)})
    save({"v": 2}, tmp_path / "c")  # a complete save replaces it, leaving no stale files
    assert_same(load(tmp_path / "c"), {"v": 2})
    assert [p.name for p in (tmp_path / "c").iterdir()] == [MANIFEST] and list(tmp_path.iterdir()) == [tmp_path / "c"]


def test_replaces_a_file_but_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "f.pt").write_bytes(b"old torch.save")
    save([1], tmp_path / "f.pt")
    assert load(tmp_path / "f.pt") == [1]
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep")
    with pytest.raises(SerdeError, match="refusing to replace .*home.*without state.json"):
        save([1], tmp_path / "home")
    assert (tmp_path / "home" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pt", "home"]


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(SerdeError, match=r"cannot read manifest .*nothing/state.json"):
        load(tmp_path / "nothing")
    save({"m": {"w": np.ones((2, 2))}}, tmp_path / "c")
    (tmp_path / "c/m/w.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(SerdeError, match=r"cannot load .*c/m/w.npy"):
        load(tmp_path / "c")
    np.save(tmp_path / "c/m/w.npy", np.ones(3))
    with pytest.raises(SerdeError, match=r"c/m/w.npy' holds float64\[3\], the manifest says float64\[2, 2\]"):
        load(tmp_path / "c")
    (tmp_path / "c/m/w.npy").unlink()
    with pytest.raises(SerdeError, match=r"cannot load .*c/m/w.npy.*No such file"):
        load(tmp_path / "c")
    (tmp_path / "c" / MANIFEST).write_text('{"format": "tenplex.state", "version": 1, "root": {"type": "dict", "items": [[{"type": "int", "value": 1}, {"type": "spam"}]]}}')
    with pytest.raises(SerdeError, match=r"malformed manifest node at state\[1\].*unknown node type 'spam'"):
        load(tmp_path / "c")
    (tmp_path / "c" / MANIFEST).write_text("{}")
    with pytest.raises(SerdeError, match="is not a tenplex.state v1 manifest"):
        load(tmp_path / "c")


# -- torch -------------------------------------------------------------------------------------


def test_torch_dtypes_0d_and_views(tmp_path):
    torch = pytest.importorskip("torch")
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
              torch.uint16, torch.uint32, torch.uint64]  # fmt: skip
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {str(d): (base % 7).to(d) for d in dtypes}
    state |= {"0d": torch.tensor(3.5, dtype=torch.bfloat16), "0d_bool": torch.tensor(True), "empty": torch.zeros(0, 5)}
    state |= {"transposed": base.t(), "sliced": base[1:3, ::2], "expanded": torch.ones(3, 1).expand(3, 4), "conj": torch.tensor([1 + 2j]).conj()}
    state |= {"grad": torch.ones(2, requires_grad=True), "param": torch.nn.Parameter(torch.ones(2)), "frozen": torch.nn.Parameter(torch.ones(1), requires_grad=False)}
    state |= {"dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2, 3])}
    out = roundtrip(state, tmp_path)
    assert out["conj"].tolist() == [1 - 2j] and out["param"].is_leaf and out["grad"].is_leaf
    assert np.load(tmp_path / "ckpt/sliced.npy").tolist() == [[6.0, 8.0, 10.0], [12.0, 14.0, 16.0]]  # the data, not the storage


def test_shared_tensors_like_torch_save(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.randn(3, 3)
    out = roundtrip({"model": {"w": w, "tied": w}, "opt": [w]}, tmp_path)
    assert out["model"]["w"] is out["model"]["tied"] is out["opt"][0]
    assert len(list((tmp_path / "ckpt").rglob("*.npy"))) == 1


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_map_location_and_unsupported_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    save({"w": torch.ones(2)}, tmp_path / "c")
    assert load(tmp_path / "c", map_location="cpu")["w"].device.type == "cpu"
    with pytest.raises(SerdeError, match=r"state\['s'\]: unsupported tensor \(layout torch.sparse_coo"):
        save({"s": torch.eye(2).to_sparse()}, tmp_path / "d")
    with pytest.raises(SerdeError, match=r"state\['h'\]: unsupported dtype torch.complex32"):
        save({"h": torch.zeros(2, dtype=torch.complex32)}, tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_megatron_like_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    random.seed(1)
    np.random.seed(2)
    state = {
        "model": {"language_model": model.state_dict()},
        "optimizer": opt.state_dict(),
        "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(), "torch_rng_state": torch.get_rng_state()}],
        "iteration": 1000,
        "args": {"tensor_model_parallel_size": 2, "lr": 1.5e-4, "params_dtype": torch.bfloat16, "fp16": False, "data_path": ["a", "b"]},
        "checkpoint_version": 3.0,
    }
    out = roundtrip(state, tmp_path)
    assert out["model"]["language_model"]._metadata == model.state_dict()._metadata
    assert sorted(out["optimizer"]["state"]) == [0, 1, 2, 3] and out["optimizer"]["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert out["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    random.setstate(out["rng_state"][0]["random_rng_state"])
    np.random.set_state(out["rng_state"][0]["np_rng_state"])
    assert (random.random(), np.random.rand()) == (random.seed(1) or random.random(), np.random.seed(2) or np.random.rand())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    fresh.load_state_dict(out["model"]["language_model"])
    opt2 = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    opt2.load_state_dict(out["optimizer"])
    assert_same(opt2.state_dict()["state"], opt.state_dict()["state"])
    assert (tmp_path / "ckpt/model/language_model/0.weight.npy").exists()
    assert (tmp_path / "ckpt/optimizer/state/3/exp_avg.npy").exists()


# -- properties --------------------------------------------------------------------------------

_dtypes = st.sampled_from([np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64, np.complex64, ml_dtypes.bfloat16])
_arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype),
    _dtypes, st.lists(st.integers(0, 3), max_size=3).map(tuple), st.integers(0, 2**32),
)  # fmt: skip
_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.binary(max_size=4)
_keys = st.integers(-3, 3) | st.text(max_size=4) | st.booleans() | st.none() | st.tuples(st.integers(0, 2), st.text(max_size=2))
states = st.recursive(
    _scalars | _arrays,
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=10,
)


@given(states)
def test_roundtrip_property(tmp_path_factory, state):
    roundtrip(state, tmp_path_factory.mktemp("p"))


def test_replace_without_renameat2(tmp_path, monkeypatch):
    from tenplex.runtime.checkpoint import swap as serde

    monkeypatch.setattr(serde, "_exchange", lambda a, b: False)
    save({"w": np.ones(2)}, tmp_path / "c")
    save({"v": np.zeros(3)}, tmp_path / "c")
    assert_same(load(tmp_path / "c"), {"v": np.zeros(3)})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_import_and_numpy_load_need_no_torch(tmp_path):
    import subprocess
    import sys

    save({"w": np.ones(2)}, tmp_path / "c")
    code = f"import sys; from tenplex.runtime.checkpoint import load; load({str(tmp_path / 'c')!r}); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_save_makes_the_directories_above_it_and_names_what_it_cannot_make(tmp_path):
    """Issue 13 item 1: `tenplex.save(state, "ckpt/step7")` without ckpt/ was a FileNotFoundError traceback."""
    save({"w": np.arange(3)}, tmp_path / "ckpt" / "deep" / "step7")
    assert load(tmp_path / "ckpt" / "deep" / "step7")["w"].tolist() == [0, 1, 2]
    (tmp_path / "file").write_text("x")
    with pytest.raises(SerdeError, match=rf"{tmp_path / 'file'}: cannot write: .*ENOTDIR|{tmp_path / 'file'}: cannot write"):
        save({"w": np.arange(3)}, tmp_path / "file" / "step7")
