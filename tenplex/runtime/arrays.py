"""numpy views of sub-tensors: dtypes (and how `.npy` files store them), piece views, and the arange oracle.

`piece_view(array, piece)` is the one place that maps a piece's global box onto a local array:
a slice for equal-extent pieces, a reshaped flat run for 1-D-local (ZeRO) pieces. Copy ops read
and write through it, so both layouts share every other line of the runtime.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from tenplex.ir.box import Box
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import Piece, SubTensor

_EXTRA = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
EXTRA_DTYPES = tuple(_EXTRA)  # ml_dtypes, not numpy: no numpy descr, no torch view without an integer one


def np_dtype(name: str) -> np.dtype:
    return np.dtype(_EXTRA.get(name, name))


def npy_descr(dtype: np.dtype) -> str:
    """The `.npy` header `descr` of `dtype`: its name for the `EXTRA_DTYPES` (so that `np.load`
    returns the dtype where ml_dtypes is imported and refuses where it is not), else numpy's own."""
    return dtype.name if dtype.name in EXTRA_DTYPES else np.lib.format.dtype_to_descr(dtype)


@functools.lru_cache(maxsize=1024)  # a checkpoint's files share a few shapes (a parameter and its moments)
def npy_header(dtype: np.dtype, shape: tuple[int, ...], fortran: bool = False) -> bytes:
    """The `.npy` header (format 1.0, or 2.0 past 64 KiB, as `np.save` chooses; with `npy_descr`)
    of an array of `dtype` and `shape` whose bytes follow in C order (Fortran order with `fortran`)."""
    import io

    out = io.BytesIO()
    d = {"descr": npy_descr(np.dtype(dtype)), "fortran_order": fortran, "shape": tuple(shape)}
    try:
        np.lib.format.write_array_header_1_0(out, d)
    except ValueError:
        np.lib.format.write_array_header_2_0(out, d)
    return out.getvalue()


def npy_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a `.npy` file names for arrays of `dtype`: itself, or same-width raw unsigned bits
    (bfloat16, float8: numpy has no portable name for them)."""
    fmt = np.lib.format
    if fmt.descr_to_dtype(fmt.dtype_to_descr(dtype)) == dtype:
        return dtype
    return np.dtype(f"u{dtype.itemsize}")


def view(array: np.ndarray, box: Box) -> np.ndarray:
    """The view of `box` in `array` (a 0-d view, not a scalar, for 0-d boxes)."""
    return array[box.to_slices() + (Ellipsis,)]


def piece_view(array: np.ndarray, piece: Piece) -> np.ndarray:
    """A view of `array` with the shape of the piece's global box (never a copy)."""
    local = view(array, piece.local_box)
    if piece.flat:
        return local.reshape(piece.global_box.shape)
    return local


def region(array: np.ndarray, piece: Piece, box: Box) -> np.ndarray:
    """The view of global region `box` (inside the piece) in `array`."""
    origin = piece.global_box
    if not origin.contains(box):
        raise ExecutionError(f"region {box} is outside piece {origin}")
    at = tuple(slice(a - o, b - o) for a, b, o in zip(box.start, box.stop, origin.start))  # `box.relative_to(origin.start)`, no Box made
    return piece_view(array, piece)[at + (Ellipsis,)]


def run_of(shape: tuple[int, ...], piece: Piece, box: Box) -> int | None:
    """The element offset of global region `box` (inside the piece) in a C-ordered local array
    of `shape` where the region is one run of it, else None: `region(array, piece, box)` in
    integers, no view made (`checkpoint.planned` places a file's runs with it). Raises
    ExecutionError as `region` does. An empty region is left to `region` (None)."""
    origin = piece.global_box
    if not origin.contains(box):
        raise ExecutionError(f"region {box} is outside piece {origin}")
    if piece.flat:  # the local side is the 1-D run local_box of the global box's C order
        base, dims, start = piece.local_box.start[0], origin.shape, [a - o for a, o in zip(box.start, origin.start)]
    else:
        base, dims, start = 0, shape, [a - o + lo for a, o, lo in zip(box.start, origin.start, piece.local_box.start)]
    return _run(dims, start, box.shape, base)


def box_run(shape: tuple[int, ...], box: Box) -> int | None:
    """The element offset of local `box` in a C-ordered array of `shape` where `view(array, box)`
    is one run of it, else None (also for an empty box or one not inside the array)."""
    if len(box.start) != len(shape) or any(a < 0 or b > n for a, b, n in zip(box.start, box.stop, shape)):
        return None
    return _run(shape, box.start, box.shape, 0)


def _run(dims: tuple[int, ...] | list[int], start: list[int] | tuple[int, ...], extents: tuple[int, ...], base: int) -> int | None:
    """`base` + the C-order offset of `start` in `dims` where the block of `extents` there is
    one run (every dimension before a partial one has extent 1), else None (also when empty)."""
    offset, wide = 0, False
    for n, a, e in zip(dims, start, extents):
        if e == 0 or (wide and e != n):
            return None
        wide = wide or e != 1
        offset = offset * n + a
    return base + offset


def empty_local(ptc: PTC, st: SubTensor) -> np.ndarray:
    return np.empty(st.shape, dtype=np_dtype(ptc.tensor_map[st.tensor].dtype))


def arange_tensors(ptc: PTC) -> dict[str, np.ndarray]:
    """Every tensor filled with distinct values (its flat index plus an offset per tensor),
    cast to its dtype: the oracle's global state."""
    out, offset = {}, 0
    for meta in ptc.tensors:
        n = int(np.prod(meta.shape, dtype=np.int64))
        values = np.arange(offset, offset + n, dtype=np.int64).reshape(meta.shape)
        out[meta.name] = _cast(values, np_dtype(meta.dtype))
        offset += n
    return out


def arange_values(ptc: PTC) -> dict[tuple[str, int], dict[str, object]]:
    """(partition id, device) -> values for every instance: each literal value, and a distinct
    string `"<name>@<partition>"` where the PTC leaves a value to be inherited: the oracle's values."""
    return {(p.id, d): {n: v.value if v.value is not None else f"{n}@{p.id}" for n, v in p.values}
            for p in ptc.partitions for d in ptc.allocation.devices_of(p.id)}  # fmt: skip


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return (values % 2).astype(dtype)
    if dtype.itemsize == 1 or dtype.kind == "f" and dtype.itemsize == 2:
        return (values % 251 + 1).astype(dtype)  # exactly representable in 8-bit and 16-bit floats
    return values.astype(dtype)


def materialize(ptc: PTC, tensors: dict[str, np.ndarray], st: SubTensor) -> np.ndarray:
    """The local array of `st` cut from full tensors: pieces copied, fill elsewhere."""
    out = empty_local(ptc, st)
    out[...] = st.fill
    for p in st.pieces:
        piece_view(out, p)[...] = view(tensors[st.tensor], p.global_box)
    return out


def materialize_all(ptc: PTC, tensors: dict[str, np.ndarray]) -> dict[tuple[str, int], np.ndarray]:
    """(sub-tensor id, device) -> local array, for every instance of the PTC."""
    return {(st.id, d): materialize(ptc, tensors, st) for st in ptc.subtensors for d in ptc.devices_of_subtensor(st.id)}
