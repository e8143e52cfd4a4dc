"""The safetensors header parser against the `safetensors` package (a test-only peer): files it
writes read back bit for bit, files tenplex writes load with it, and one test per refusal of a
malformed file (each message names the file and the field)."""

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

st_numpy = pytest.importorskip("safetensors.numpy")
torch = pytest.importorskip("torch")

from tenplex.frameworks.hf.errors import HfError  # noqa: E402
from tenplex.frameworks.hf.header import DTYPES, map_tensors, read_header  # noqa: E402
from tenplex.frameworks.hf.read import read_hf  # noqa: E402
from tenplex.frameworks.hf.write import whole_ptc, write_hf  # noqa: E402
from tenplex.runtime.arrays import np_dtype  # noqa: E402

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "float32", "int64", "float64"]


def _array(draw, dtype, shape):
    n = int(np.prod(shape))
    raw = draw(st.binary(min_size=n * np_dtype(dtype).itemsize, max_size=n * np_dtype(dtype).itemsize))
    a = np.frombuffer(raw, np.uint8).view(np_dtype(dtype)).reshape(shape)
    return np.asarray(a != 0) if dtype == "bool" else a


@st.composite
def tensor_dicts(draw, dtypes=NUMPY_DTYPES):
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_.]{0,8}", fullmatch=True), min_size=1, max_size=5, unique=True))
    out = {}
    for name in names:
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        out[name] = _array(draw, draw(st.sampled_from(dtypes)), shape)
    return out


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


@given(tensor_dicts())
def test_files_the_safetensors_package_writes_map_bit_for_bit(tmp_path_factory, tensors):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    st_numpy.save_file(tensors, str(path), metadata={"format": "np"})
    header = read_header(path)
    got = map_tensors(header)
    assert header.metadata == {"format": "np"} and set(got) == set(tensors)
    for name, a in tensors.items():
        _same_bits(got[name], a)
        assert not got[name].flags.writeable  # a view of the read-only map, not a copy


@given(tensor_dicts(NUMPY_DTYPES + ["bfloat16"]), st.sampled_from([None, 1, 64]))
def test_what_tenplex_writes_the_safetensors_package_loads(tmp_path_factory, tensors, shard):
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("w") / "hf"
    ptc, arrays = _whole(tensors)
    files = write_hf(ptc, arrays, {}, out, shard)
    loaded = {k: v for f in files for k, v in load_file(str(out / f)).items()}
    assert all(read_header(out / f).data_start % 8 == 0 for f in files)
    _, back, _ = read_hf(out)
    for name, a in tensors.items():
        _same_bits(back[name], a)
        t = loaded[name]
        assert tuple(t.shape) == a.shape and t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == a.tobytes()
    assert (out / "model.safetensors.index.json").exists() == (len(files) > 1)


def _whole(tensors):
    from tenplex.ir.ptc import PTC, Allocation, Partition
    from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
    from tenplex.ir.topology import Device, Topology

    metas = [TensorMeta(n, a.shape, a.dtype.name) for n, a in tensors.items()]
    subs = [SubTensor(m.name, m.name, m.name, m.shape, (Piece(m.box, m.box),) if m.box.volume else ()) for m in metas]
    ptc = PTC(metas, subs, [Partition("p", [m.name for m in metas])], Allocation({"p": (0,)}), Topology((Device(0, "h0"),)))
    return whole_ptc(ptc), dict(tensors)


def _file(tmp_path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
MALFORMED = {
    "short_length": (lambda p: p.joinpath("model.safetensors").write_bytes(b"\x01\x00"), "less than the 8-byte header length"),
    "length_past_end": (lambda p: _file(p, {"a": T}, bytes(8), length=10_000), "header length 10000 does not fit"),
    "not_json": (lambda p: _file(p, b"{nope"), "header is not a JSON object"),
    "not_object": (lambda p: _file(p, b"[1, 2]"), "header is list, not a JSON object"),
    "duplicate_key": (lambda p: _file(p, b'{"a": 1, "a": 2}'), "key 'a' appears twice"),
    "bad_metadata": (lambda p: _file(p, {"__metadata__": {"k": 1}}), "__metadata__ is {'k': 1}, not a map of strings"),
    "unknown_dtype": (lambda p: _file(p, {"a": {**T, "dtype": "F4"}}, bytes(8)), "tensor 'a' dtype 'F4' is not one tenplex reads"),
    "bad_shape": (lambda p: _file(p, {"a": {**T, "shape": [-2]}}, bytes(8)), "tensor 'a' shape [-2] is not a list"),
    "bad_offsets": (lambda p: _file(p, {"a": {**T, "data_offsets": [0]}}, bytes(8)), "tensor 'a' data_offsets [0] are not two"),
    "missing_field": (lambda p: _file(p, {"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "tensor 'a' is {'dtype'"),
    "wrong_size": (lambda p: _file(p, {"a": {**T, "data_offsets": [0, 4]}}, bytes(8)), "hold 4 bytes, but F32[2] needs 8"),
    "truncated": (lambda p: _file(p, {"a": T}, bytes(5)), "exceed the file's 5 data bytes: truncated"),
    "overlap": (lambda p: _file(p, {"a": T, "b": {**T, "data_offsets": [4, 12]}}, bytes(12)), "tensor 'b' data_offsets [4, 12) overlap tensor 'a' [0, 8)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_refused_naming_file_and_field(tmp_path, case):
    make, message = MALFORMED[case]
    make(tmp_path)
    with pytest.raises(HfError, match=r"model\.safetensors: .*") as e:
        read_header(tmp_path / "model.safetensors")
    assert message in str(e.value)


def test_every_dtype_code_maps_to_a_tenplex_dtype_of_its_width(tmp_path):
    widths = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
              "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "C64": 8}  # fmt: skip
    assert {code: np_dtype(name).itemsize for code, name in DTYPES.items()} == widths
    header = {c: {"dtype": c, "shape": [1], "data_offsets": [8 * i, 8 * i + widths[c]]} for i, c in enumerate(DTYPES)}
    got = map_tensors(read_header(_file(tmp_path, header, bytes(8 * len(DTYPES)))))
    assert {c: a.dtype for c, a in got.items()} == {c: np_dtype(DTYPES[c]) for c in DTYPES}
