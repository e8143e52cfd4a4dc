"""bfloat16 and float8 in `.npy` files (issue 13 item 13): every writer tenplex owns names the
dtype in the header (`descr: 'bfloat16'`), so `np.load` returns that dtype where ml_dtypes is
imported and refuses the file where it is not, never a silent uint16; and every reader still
reads the raw bits (`<u2`, `|u1`) that older versions wrote where the manifest or ptc.json names
the dtype. The FUSE view's headers and writes are in test_fuse.py."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tenplex.ir.serialize import ptc_from_json
from tenplex.runtime.checkpoint import MANIFEST, SerdeError, load, save
from tenplex.runtime.checkpoint.directory import CheckpointError, read_checkpoint, write_checkpoint
from tenplex.runtime.checkpoint.npy import as_dtype, write_npy
from tenplex.runtime.checkpoint.store_dir import open_dir, write_back
from tenplex.runtime.fuse.npy import NpyFile

DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}


def _array(dtype: np.dtype) -> np.ndarray:
    return (np.arange(6, dtype=np.float32) - 2).astype(dtype).reshape(2, 3)


def _header(data: bytes) -> dict:
    """The header dict of format-1.0 `.npy` bytes."""
    assert data[:8] == b"\x93NUMPY\x01\x00"
    return ast.literal_eval(data[10 : 10 + int.from_bytes(data[8:10], "little")].decode())


def _written(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    write_npy(f, a)
    return f.getvalue()


@pytest.mark.parametrize("name", DTYPES)
def test_write_npy_names_the_dtype_and_np_load_returns_it(name):
    a = _array(DTYPES[name])
    data = _written(a)
    assert _header(data)["descr"] == name
    assert data == NpyFile.from_leaf(a).read(10**6, 0)  # the FUSE view serves the same bytes
    got = np.load(io.BytesIO(data))
    assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


def test_numpy_dtypes_keep_the_bytes_np_save_writes():
    for a in (np.arange(6.0), np.ones((2, 3), np.int16), np.array(3, np.uint8)):
        f = io.BytesIO()
        np.save(f, a)
        assert _written(a) == f.getvalue()


def test_np_load_without_ml_dtypes_refuses_never_uint16(tmp_path):
    save({"w": _array(DTYPES["bfloat16"])}, tmp_path / "s")
    code = (
        "import sys, numpy as np\n"
        "try:\n    a = np.load(sys.argv[1])\nexcept ValueError as e:\n    print('refused:', e)\n"
        "else:\n    print('loaded', a.dtype)\n"
        "assert 'ml_dtypes' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s/w.npy")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "'bfloat16'" in r.stdout, r.stdout


def test_tenplex_save_of_torch_tensors_names_the_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    state = {name: torch.arange(6, dtype=torch.float32).to(getattr(torch, name)) for name in DTYPES}
    save(state, tmp_path / "s")
    for name, t in state.items():
        got = np.load(tmp_path / f"s/{name}.npy")
        assert got.dtype.name == name and got.tobytes() == t.view(torch.uint8).numpy().tobytes()
    out = load(tmp_path / "s")
    assert all(torch.equal(out[n].view(torch.uint8), state[n].view(torch.uint8)) for n in DTYPES)


def _raw_bits(path: Path) -> None:
    """Rewrite the `.npy` at `path` as older tenplex versions wrote it: raw same-width unsigned bits."""
    a = np.load(path)
    np.save(path, a.view(f"u{a.dtype.itemsize}"))


@pytest.mark.parametrize("name", DTYPES)
def test_an_older_save_of_raw_bits_still_loads(tmp_path, name):
    a = _array(DTYPES[name])
    save({"w": a}, tmp_path / "s")
    _raw_bits(tmp_path / "s/w.npy")
    assert np.load(tmp_path / "s/w.npy").dtype == np.dtype(f"u{a.itemsize}")  # the old format
    got = load(tmp_path / "s")["w"]
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
    sd = open_dir(tmp_path / "s")
    assert sd.store.get("/w").dtype == a.dtype
    write_back(sd)  # rewritten in the new format
    assert np.load(tmp_path / "s/w.npy").dtype == a.dtype


def test_raw_bits_of_another_width_or_for_a_numpy_dtype_are_refused(tmp_path):
    save({"w": _array(DTYPES["bfloat16"]), "h": np.ones(3, np.float16)}, tmp_path / "s")
    np.save(tmp_path / "s/w.npy", np.zeros((2, 3), np.uint8))
    with pytest.raises(SerdeError, match=r"w\.npy' holds uint8\[2, 3\], the manifest says bfloat16\[2, 3\]"):
        load(tmp_path / "s")
    save({"h": np.ones(3, np.float16)}, tmp_path / "t")
    np.save(tmp_path / "t/h.npy", np.ones(3, np.uint16))
    with pytest.raises(SerdeError, match=r"h\.npy' holds uint16\[3\], the manifest says float16\[3\]"):
        load(tmp_path / "t")
    assert as_dtype(np.ones(3, np.uint16), np.dtype(np.float16)) is None


def _ptc():
    doc = {
        "format": "tenplex.ptc/1",
        "devices": [{"id": 0, "host": "h0"}],
        "tensors": {"w": {"shape": [2, 3], "dtype": "bfloat16"}, "f": {"shape": [2, 3], "dtype": "float8_e4m3fn"}},
        "subtensors": {t: {"tensor": t, "path": t, "box": [[0, 2], [0, 3]]} for t in ("w", "f")},
        "partitions": {"p": {"subtensors": ["f", "w"]}},
        "allocation": {"p": [0]},
    }
    return ptc_from_json(doc)


def test_a_checkpoint_directory_names_the_dtype_and_reads_older_raw_bits(tmp_path):
    arrays = {"w": _array(DTYPES["bfloat16"]), "f": _array(DTYPES["float8_e4m3fn"])}
    write_checkpoint(_ptc(), arrays, {}, tmp_path / "ck")
    for sid, a in arrays.items():
        assert np.load(tmp_path / f"ck/p/{sid}.npy").dtype == a.dtype
        _raw_bits(tmp_path / f"ck/p/{sid}.npy")
    _, got, _ = read_checkpoint(tmp_path / "ck")
    assert all(got[k].dtype == a.dtype and got[k].tobytes() == a.tobytes() for k, a in arrays.items())
    sd = open_dir(tmp_path / "ck")
    write_back(sd)
    assert np.load(tmp_path / "ck/p/w.npy").dtype == arrays["w"].dtype
    np.save(tmp_path / "ck/p/w.npy", np.zeros((2, 3), np.float16))
    with pytest.raises(CheckpointError, match=r"w\.npy: holds float16\[2, 3\], expected bfloat16\[2, 3\] \(sub-tensor 'w'\)"):
        read_checkpoint(tmp_path / "ck")


def test_the_manifest_keeps_naming_the_dtype(tmp_path):
    save({"w": _array(DTYPES["bfloat16"])}, tmp_path / "s")
    node = json.loads((tmp_path / "s" / MANIFEST).read_text())["root"]["items"][0][1]
    assert node == {"type": "ndarray", "file": "w.npy", "dtype": "bfloat16", "shape": [2, 3]}
