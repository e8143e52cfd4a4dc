"""`read_npy_header`: numpy's own spelling read by one regular expression, anything else by
numpy's parser; the answer (shape, fortran order, dtype, position after the header) and every
refusal are numpy's, header by header."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

from tenplex.ir import npy_header
from tenplex.ir.npy_header import read_npy_header

_fmt = np.lib.format


def _numpy(data: bytes):
    f = io.BytesIO(data)
    try:
        version = _fmt.read_magic(f)
        read = _fmt.read_array_header_1_0 if version == (1, 0) else _fmt.read_array_header_2_0
        return read(f), f.tell()
    except Exception:  # noqa: BLE001 (any refusal)
        return "refused"


def _ours(data: bytes):
    f = io.BytesIO(data)
    try:
        return read_npy_header(f), f.tell()
    except ValueError:
        return "refused"


def _saved(a: np.ndarray, version=None) -> bytes:
    f = io.BytesIO()
    _fmt.write_array(f, a, version=version)
    return f.getvalue()


ARRAYS = {"2d": np.zeros((3, 4), np.float32), "1d-bf16": np.zeros(5, ml_dtypes.bfloat16), "0d": np.zeros((), np.int8),
          "3d-big-endian": np.zeros((2, 3, 4), ">f8"), "fortran": np.asfortranarray(np.zeros((3, 4))),
          "empty": np.zeros((0, 7), np.uint16), "30d": np.zeros([1] * 30, np.float16)}  # fmt: skip
GOOD = {**{k: _saved(a) for k, a in ARRAYS.items()}, **{f"{k}-v2": _saved(a, (2, 0)) for k, a in ARRAYS.items()}}
OTHER = {  # other spellings and broken headers: numpy accepts some, refuses others
    "truncated": GOOD["2d"][:40], "no-magic": b"NOTNUMPY" + GOOD["2d"][8:], "v3": GOOD["2d"][:6] + b"\x03\x00" + GOOD["2d"][8:],
    "spaced": GOOD["2d"].replace(b"(3, 4)", b"(3,4) "), "not-a-dtype": GOOD["2d"].replace(b"<f4", b"<zz"),
    "other-key": GOOD["2d"].replace(b"'shape'", b"'shapf'"), "negative": GOOD["2d"].replace(b"(3, 4)", b"(3,-4)"),
    "huge": _fmt.magic(1, 0) + (20000).to_bytes(2, "little") + b"{" + b" " * 19998 + b"\n"}  # fmt: skip


@pytest.mark.parametrize("name", [*GOOD, *OTHER])
def test_the_answer_is_numpys(name):
    data = {**GOOD, **OTHER}[name]
    assert _ours(data) == _numpy(data)
    assert (_ours(data) == "refused") == (name in ("truncated", "no-magic", "v3", "not-a-dtype", "other-key", "huge"))


def test_numpys_spelling_never_reaches_numpys_parser(monkeypatch):
    monkeypatch.setattr(_fmt, "read_magic", lambda f: pytest.fail("numpy's parser ran"))
    for data in GOOD.values():
        assert _ours(data) != "refused"
    assert npy_header._canonical_npy_header(io.BytesIO(OTHER["spaced"])) is None
