"""`PlannedFiles` places a file's runs from the boxes (`arrays.run_of`, `arrays.box_run`): the
offsets are those of numpy's views, and a copy whose src region is one run of a mapped file
makes no view of the src (the kernel copies it file to file)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tenplex.ir.box import Box
from tenplex.ir.errors import ExecutionError
from tenplex.ir.tensor import Piece
from tenplex.runtime.arrays import box_run, region, run_of, view
from tenplex.runtime.checkpoint import planned
from tests.runtime.test_reshard_files import _assert_oracle, _write_all, case  # noqa: F401 (a fixture)


@hs.composite
def _boxes(draw, shape: tuple[int, ...]) -> Box:
    start = [draw(hs.integers(0, n)) for n in shape]
    return Box(tuple(start), tuple(draw(hs.integers(a, n)) for a, n in zip(start, shape)))


@hs.composite
def _piece_and_box(draw) -> tuple[np.ndarray, Piece, Box]:
    """A local array, one of its pieces (equal extents, or flat: a 1-D run of a global box) and a region of the piece."""
    g_shape = tuple(draw(hs.lists(hs.integers(1, 5), min_size=0, max_size=3)))
    origin = tuple(draw(hs.integers(0, 3)) for _ in g_shape)
    g = Box(origin, tuple(o + n for o, n in zip(origin, g_shape)))
    if draw(hs.booleans()) and len(g_shape) > 1:  # flat: local 1-D array, the piece a run of it
        at = draw(hs.integers(0, 4))
        array = np.arange(at + g.volume + draw(hs.integers(0, 4)), dtype=np.int32)
        piece = Piece(g, Box((at,), (at + g.volume,)))
    else:
        local_shape = tuple(n + draw(hs.integers(0, 3)) for n in g_shape)
        lo = tuple(draw(hs.integers(0, m - n)) for m, n in zip(local_shape, g_shape))
        array = np.arange(math.prod(local_shape), dtype=np.int32).reshape(local_shape)
        piece = Piece(g, Box(lo, tuple(a + n for a, n in zip(lo, g_shape))))
    box = draw(_boxes(g_shape))
    return array, piece, Box(tuple(a + o for a, o in zip(box.start, origin)), tuple(b + o for b, o in zip(box.stop, origin)))


@settings(max_examples=400, deadline=None)
@given(_piece_and_box())
def test_run_of_is_the_offset_of_numpys_view_where_it_is_one_run(drawn):
    array, piece, box = drawn
    v = region(array, piece, box)
    want = (v.ctypes.data - array.ctypes.data) // array.itemsize if v.size and v.flags.c_contiguous else None
    assert run_of(array.shape, piece, box) == want


@settings(max_examples=300, deadline=None)
@given(hs.lists(hs.integers(1, 5), min_size=0, max_size=3).flatmap(lambda s: hs.tuples(hs.just(tuple(s)), _boxes(tuple(s)))))
def test_box_run_is_the_offset_of_numpys_view_where_it_is_one_run(drawn):
    shape, box = drawn
    array = np.arange(math.prod(shape), dtype=np.int16).reshape(shape)
    v = view(array, box)
    want = (v.ctypes.data - array.ctypes.data) // array.itemsize if v.size and v.flags.c_contiguous else None
    assert box_run(shape, box) == want
    if shape:  # a box past the array: left to numpy (which clips it), as one not of its ndim
        assert box_run(shape, Box((0,) * len(shape), tuple(n + 1 for n in shape))) is None
        assert box_run(shape, Box((), ())) is None


def test_run_of_refuses_a_region_outside_its_piece_as_region_does():
    piece = Piece(Box((2, 0), (4, 8)), Box((0, 0), (2, 8)))
    for fn in (lambda: region(np.zeros((2, 8)), piece, Box((1, 0), (3, 8))), lambda: run_of((2, 8), piece, Box((1, 0), (3, 8)))):
        with pytest.raises(ExecutionError, match=r"is outside piece"):
            fn()


def test_runs_of_mapped_src_files_are_copied_without_a_view(case, tmp_path, monkeypatch):  # noqa: F811
    """Only the copies whose src region is not one run of its file (column blocks) look at the
    src through numpy; every other op goes from its boxes to `copy_file_range`."""
    root, tensors, dst, files, values = case
    viewed, real = [], planned.source_region
    monkeypatch.setattr(planned, "source_region", lambda op, *a: viewed.append(op) or real(op, *a))
    _write_all(files, dst, values, tmp_path / "out")
    _assert_oracle(tmp_path / "out", dst, tensors)
    ops = [op for sid_ops in files.ops.values() for op in sid_ops if not isinstance(op, planned.FillOp)]
    whole = [op for op in ops if run_of(files.src_arrays[(op.src_subtensor, op.src_device)].shape,
                                        files.src.subtensor_map[op.src_subtensor].pieces[op.src_piece], op.box) is not None]  # fmt: skip
    assert whole and len(viewed) == len(ops) - len(whole)


def test_an_empty_fill_leaves_its_file_to_the_runs(case, tmp_path, monkeypatch):  # noqa: F811
    """An empty region (a fill of nothing) is placed from its view, and the file's other regions
    still go file to file: one path writes every file. (It used to send the whole file to a
    second path, which made a numpy view of each src region and sorted its regions by (offset,
    op): an empty fill at the offset of a copy raised TypeError there.)"""
    root, tensors, dst, files, values = case
    sid = next(s for s, ops in files.ops.items() if len(ops) == 1 and not isinstance(ops[0], planned.FillOp)
               and run_of(files.dst.subtensor_map[s].shape, files.dst.subtensor_map[s].pieces[ops[0].dst_piece], ops[0].box) == 0)  # fmt: skip
    copy = files.ops[sid][0]
    shape = files.dst.subtensor_map[sid].shape
    empty = planned.FillOp(copy.dst_device, sid, Box((0,) * len(shape), (0, *shape[1:])), 7)
    viewed, real = [], planned.source_region
    monkeypatch.setattr(planned, "source_region", lambda op, *a: viewed.append(op) or real(op, *a))
    files.ops[sid] = [empty, copy]
    try:
        _write_all(files, dst, values, tmp_path / "out")
    finally:
        files.ops[sid] = [copy]
    _assert_oracle(tmp_path / "out", dst, tensors)
    assert copy not in viewed
