"""Plan slices and message parts: regions as numbers equal numpy's views, both ends of every part
agree, every copy runs exactly once; packing; the scratch pool."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.compiler.emit.slices import FORMAT, SINGLE_MIN, c_contiguous, host_slices, region_of
from tenplex.ir.box import Box
from tenplex.ir.errors import ExecutionError
from tenplex.ir.tensor import Piece
from tenplex.runtime.agent.parts import Scratch, pack, unpack
from tenplex.runtime.agent.rounds import Execution
from tenplex.runtime.arrays import region


@st.composite
def shapes_and_boxes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    start = tuple(draw(st.integers(0, s - 1)) for s in shape)
    stop = tuple(draw(st.integers(a + 1, s)) for a, s in zip(start, shape))
    return shape, Box(start, stop)


def _numbers(array: np.ndarray, view: np.ndarray) -> tuple[int, tuple, tuple]:
    item = array.itemsize
    offset = (view.__array_interface__["data"][0] - array.__array_interface__["data"][0]) // item
    return offset, view.shape, tuple(s // item for s in view.strides)


def _same(numbers: tuple, array: np.ndarray, view: np.ndarray) -> None:
    at, shape, strides = numbers
    assert (at, tuple(shape)) == _numbers(array, view)[:2]
    assert all(a == b for a, b, e in zip(strides, _numbers(array, view)[2], shape) if e > 1)  # numpy may pick any stride for extent 1
    assert c_contiguous(shape, strides) == view.flags.c_contiguous


@given(shapes_and_boxes(), st.integers(0, 3), st.integers(0, 2))
def test_regions_of_equal_extent_pieces_are_numpys_views(case, offset, pad):
    shape, box = case
    local = tuple(s + pad for s in shape)
    piece = Piece(Box.from_shape(shape).translate((offset,) * len(shape)), Box.from_shape(shape).translate((pad,) * len(shape)))
    array = np.zeros(local, dtype=np.float32)
    global_box = box.translate((offset,) * len(shape))
    _same(region_of(local, piece, global_box), array, region(array, piece, global_box))


@given(shapes_and_boxes(), st.integers(0, 3))
def test_regions_of_flat_pieces_are_numpys_views(case, lead):
    shape, box = case
    n = int(np.prod(shape))
    if len(shape) < 2:
        shape, box = (1, *shape), Box((0, *box.start), (1, *box.stop))
    piece = Piece(Box.from_shape(shape), Box((lead,), (lead + n,)))
    array = np.zeros(lead + n + 2, dtype=np.int16)
    _same(region_of((lead + n + 2,), piece, box), array, region(array, piece, box))


def test_contiguity_cases():
    assert c_contiguous((2, 6), (6, 1))  # whole rows
    assert c_contiguous((1, 4), (6, 1))  # part of one row
    assert not c_contiguous((4, 3), (6, 1))  # a column half
    assert c_contiguous((), ())


@given(st.lists(shapes_and_boxes(), min_size=1, max_size=4))
def test_pack_then_unpack_restores_every_view(cases):
    arrays = [np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) + 100 * k for k, (shape, _) in enumerate(cases)]
    views = [a[b.to_slices() + (Ellipsis,)] for a, (_, b) in zip(arrays, cases)]
    buffer = np.empty(sum(v.nbytes for v in views), dtype=np.uint8)
    pack(views, buffer)
    expected = [v.copy() for v in views]
    for v in views:
        v[...] = -1
    unpack(views, buffer)
    assert all(np.array_equal(v, e) for v, e in zip(views, expected))
    with pytest.raises(ExecutionError, match="but the views take"):
        pack(views, np.empty(buffer.nbytes + 1, dtype=np.uint8))


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


def test_slices_give_both_ends_of_every_part_and_every_copy_once():
    from tenplex.compiler import CopyOp, compile_plan
    from tenplex.frontends.spec import ptc_from_spec

    src = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp2,pp1,dp1@2x1")
    dst = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp1,pp2,dp1@2x1")
    plan = compile_plan(src, dst)
    slices = host_slices(plan, src, dst, ["h0", "h1"])
    ends: dict[int, list] = {}
    seen: list[int] = []
    for host, sl in slices.items():
        assert (sl["format"], sl["host"]) == (FORMAT, host)
        ex = Execution(host, "j", "a", "b", sl)
        for rows in ex.copies.values():
            seen += [op for _, _, op, _, _ in rows]
        for rows in ex.parts.values():
            for r, peer, outgoing, tag, nbytes, first, count, message in rows:
                ops = [op for _, op in ex.part_regions[first : first + count]]
                ends.setdefault(tag, []).append((host, ex.peers[peer], outgoing, nbytes, message, r, ops))
                if outgoing:
                    seen += ops
    for tag, (a, b) in ((t, sorted(e, key=lambda x: -x[2])) for t, e in ends.items()):
        assert a[0] == b[1] and a[1] == b[0] and (a[2], b[2]) == (1, 0), tag  # one sender, one receiver
        assert a[3:] == b[3:], tag  # same bytes, message, round and ops in the same order
        assert a[3] == sum(plan.ops[i].box.volume * dst.itemsizes[plan.ops[i].tensor] for i in a[6])
    singles = [e for e in ends.values() if len(e[0][6]) == 1 and e[0][3] >= SINGLE_MIN]
    assert singles and len(ends) > len(singles)  # big contiguous ops alone, the rest packed
    copies = [i for i, op in enumerate(plan.ops) if isinstance(op, CopyOp)]
    assert sorted(seen) == copies  # every copy exactly once


def test_a_slice_for_another_host_or_a_torn_table_is_refused():
    from tenplex.compiler import compile_plan
    from tenplex.frontends.spec import ptc_from_spec

    src = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp2,pp1,dp1@2x1")
    dst = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp1,pp2,dp1@2x1")
    sl = host_slices(compile_plan(src, dst), src, dst, ["h0", "h1"])["h0"]
    with pytest.raises(ExecutionError, match="expected a tenplex.slice/1 slice for 'h1'"):
        Execution("h1", "j", "a", "b", sl)
    with pytest.raises(ExecutionError, match="slice field 'parts' is not int64 rows of 8"):
        Execution("h0", "j", "a", "b", {**sl, "parts": sl["parts"][:-8] + b"\0"})


def test_a_decoded_slice_batches_copies_and_checks_part_sizes(monkeypatch):
    from tenplex.compiler import compile_plan
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.agent import sliced

    src = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp2,pp1,dp1@2x1")
    dst = ptc_from_spec("gpt-tiny:hidden=256,ffn=1024,tp1,pp2,dp1@2x1")
    sl = host_slices(compile_plan(src, dst), src, dst, ["h0", "h1"])["h0"]
    monkeypatch.setattr(sliced, "BATCH_BYTES", 64 << 10)
    s = sliced.Sliced("h0", sl)
    for r, rows in s.copies.items():  # every copy once, in order; a batch ends once it holds BATCH_BYTES
        assert [row for batch in s.batches[r] for row in batch] == rows
        assert all(sum(s.views[row[4]].nbytes for row in b[:-1]) < 64 << 10 for b in s.batches[r])
        assert len(s.batches[r]) > 1
    part = next(p for ps in s.network.values() for p in ps if len(p.regions) > 1)
    assert not part.in_place and part.nbytes == sum(s.views[i].nbytes for i in part.regions)
    rows = np.frombuffer(sl["parts"], "<i8").reshape(-1, 8).copy()
    rows[0, 4] += 1  # one byte more than its regions hold
    with pytest.raises(ExecutionError, match=r"message \d+ \((h0 -> h1|h1 -> h0), round \d+, ops .*\): its regions hold \d+ B, the plan says \d+ B"):
        sliced.Sliced("h0", {**sl, "parts": rows.tobytes()})
