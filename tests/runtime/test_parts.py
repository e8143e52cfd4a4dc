"""Message parts: shape-only contiguity equals numpy's flag; the scratch pool; the prefaulter."""

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.ir.box import Box
from tenplex.ir.tensor import Piece
from tenplex.runtime.agent.parts import Prefaulter, Scratch, contiguous
from tenplex.runtime.arrays import region


@st.composite
def shapes_and_boxes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    start = tuple(draw(st.integers(0, s - 1)) for s in shape)
    stop = tuple(draw(st.integers(a + 1, s)) for a, s in zip(start, shape))
    return shape, Box(start, stop)


@given(shapes_and_boxes(), st.integers(0, 3))
def test_contiguity_of_equal_extent_pieces_matches_numpy(case, offset):
    shape, box = case
    piece = Piece(Box.from_shape(shape).translate((offset,) * len(shape)), Box.from_shape(shape))
    array = np.zeros(shape, dtype=np.float32)
    global_box = box.translate((offset,) * len(shape))
    assert contiguous(shape, piece, global_box) == region(array, piece, global_box).flags.c_contiguous


@given(shapes_and_boxes(), st.integers(0, 3))
def test_contiguity_of_flat_pieces_matches_numpy(case, lead):
    shape, box = case
    n = int(np.prod(shape))
    if len(shape) < 2 and n > 0:
        shape, box = (1, *shape), Box((0, *box.start), (1, *box.stop))
    piece = Piece(Box.from_shape(shape), Box((lead,), (lead + n,)))
    array = np.zeros(lead + n + 2, dtype=np.int16)
    assert contiguous((lead + n + 2,), piece, box) == region(array, piece, box).flags.c_contiguous


def test_row_major_cases():
    piece = Piece(Box.from_shape((4, 6)), Box.from_shape((4, 6)))
    assert contiguous((4, 6), piece, Box((1, 0), (3, 6)))  # whole rows
    assert contiguous((4, 6), piece, Box((2, 1), (3, 5)))  # part of one row
    assert not contiguous((4, 6), piece, Box((0, 0), (4, 3)))  # a column half
    assert contiguous((4, 6), piece, Box((0, 0), (0, 6)))  # empty


def test_scratch_hands_out_disjoint_slices_and_reuses_its_pages():
    pool = Scratch()
    pool.reserve(100)
    a, b = pool.take(60), pool.take(40)
    assert not np.shares_memory(a, b) and a.nbytes == 60 and b.nbytes == 40
    with pytest.raises(ValueError, match="scratch pool of 100 B has 0 B left, 1 B asked"):
        pool.take(1)
    pool.reserve(80)  # smaller: the same buffer again
    assert np.shares_memory(pool.take(80), a)
    pool.release()
    assert pool.nbytes == 0


def test_prefaulter_never_writes_a_claimed_array():
    arrays = [(k, np.full(3 << 20, 7, dtype=np.uint8)) for k in range(8)]
    pf = Prefaulter(arrays)
    pf.claim([5, 6, 7])
    # after the claim returns, claimed arrays are ours: data written now must survive
    for k in (5, 6, 7):
        arrays[k][1][...] = 9
    time.sleep(0.05)
    pf.stop()
    for k in (5, 6, 7):
        assert (arrays[k][1] == 9).all()
    touched = [k for k, a in arrays[:5] if (a == 0).all()]
    assert touched == list(range(len(touched)))  # in order, and only unclaimed ones


def test_prefaulter_claim_waits_for_a_chunk_in_progress():
    big = np.ones(64 << 20, dtype=np.uint8)
    pf = Prefaulter([("big", big)])
    pf.claim(["big"])
    pf.stop()
    # every chunk is either all zero (touched before the claim) or all one (never touched)
    chunks = big.reshape(-1, Prefaulter.CHUNK)
    assert all(c.min() == c.max() for c in chunks)


def test_split_agrees_with_the_views_and_keeps_every_op_once():
    from tenplex.compiler import CopyOp, compile_plan
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.agent.parts import SINGLE_MIN, split
    from tenplex.runtime.arrays import empty_local
    from tenplex.runtime.executor import source_region, target_region

    src = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp2,pp1,dp1@2x1")
    dst = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp1,pp2,dp1@2x1")
    plan = compile_plan(src, dst)
    placed = dst.with_allocation(plan.allocation)
    src_arrays = {(s.id, d): empty_local(src, s) for s in src.subtensors for d in src.devices_of_subtensor(s.id)}
    dst_arrays = {(s.id, d): empty_local(placed, s) for s in placed.subtensors for d in placed.devices_of_subtensor(s.id)}
    kinds = set()
    for m in plan.messages:
        ops = [(i, plan.ops[i]) for i in m.ops if isinstance(plan.ops[i], CopyOp)]
        singles, packed = split(ops, src, placed)
        assert len(singles) + len(packed) == len(ops)
        for sg in singles:
            s_view = source_region(sg.op, src, placed, src_arrays, dst_arrays)
            t_view = target_region(sg.op, placed, dst_arrays)
            assert (sg.src_contiguous, sg.dst_contiguous) == (s_view.flags.c_contiguous, t_view.flags.c_contiguous)
            assert sg.nbytes == s_view.nbytes >= SINGLE_MIN and (sg.src_contiguous or sg.dst_contiguous)
            kinds.add((sg.src_contiguous, sg.dst_contiguous))
    assert (True, True) in kinds and (True, False) in kinds  # whole rows, and column halves of row-parallel weights
