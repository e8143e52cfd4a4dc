"""The compiler's one-pass reads against their definitions: `Pieces.read` (rows gathered by
sort, codes once per shared pieces tuple) against a sub-tensor-by-sub-tensor walk,
place-ranks' peer conflicts against layout sets, its solver cache against fresh solves,
`trusted_needs` against `Need`, and the stats' fill tensor lookup against the PTC's map."""

from __future__ import annotations

from collections import defaultdict

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.compiler import assignment
from tenplex.compiler.compile import _tensor_of
from tenplex.compiler.ops import Holder, Need, trusted_needs
from tenplex.compiler.passes import place_ranks
from tenplex.compiler.pieces import Pieces, codes_of
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir import Box
from tests.strategies import ptcs


def _walk(ptc, number: dict, boxes: list) -> tuple:
    """A PTC's pieces one sub-tensor at a time (the definition `Pieces.read` keeps)."""
    tensors = {t.name: ([], [], [], []) for t in ptc.tensors}
    partitions = {p.id: [] for p in ptc.partitions}
    pids = []
    for j, s in enumerate(ptc.subtensors):
        c, pid = codes_of(s, number, boxes), ptc.partition_of[s.id]
        for col, v in zip(tensors[s.tensor], (s.id, pid, c, j)):
            col.append(v)
        partitions[pid].append((s.tensor, c))
        pids.append(pid)
    return ({t: tuple(map(tuple, cols[:3])) for t, cols in tensors.items()}, partitions,
            tuple(s.id for s in ptc.subtensors), {t: tuple(cols[3]) for t, cols in tensors.items()}, tuple(pids))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(ptcs(), ptcs())
def test_pieces_read_is_the_walk_of_every_sub_tensor(src, dst):
    got = Pieces.read(src, dst)
    number, boxes = {}, []
    for side, ptc in (("src", src), ("dst", dst)):
        want = _walk(ptc, number, boxes)
        mine = getattr(got, side)
        have = (mine.tensors, mine.partitions, mine.ids, mine.numbers, mine.pids)
        assert have == want
        assert [list(d) for d in have if isinstance(d, dict)] == [list(d) for d in want if isinstance(d, dict)]
    assert got.boxes == boxes  # numbered in the same order


def test_pieces_read_of_a_175b_stage_walks_alike():
    src, dst = ptc_from_spec("gpt-175b:tp2,pp4,dp1,layers=4@1x8"), ptc_from_spec("gpt-175b:tp4,pp2,dp1,layers=4@1x8")
    got = Pieces.read(src, dst)
    number, boxes = {}, []
    for side, ptc in (("src", src), ("dst", dst)):
        mine = getattr(got, side)
        assert (mine.tensors, mine.partitions, mine.ids, mine.numbers, mine.pids) == _walk(ptc, number, boxes)


def _conflicting_by_sets(parts, rows):
    """The definition: a tensor held in two or more layouts joins all its holders."""
    layouts = {pid: defaultdict(set) for pid in parts}
    for pid in parts:
        for tensor, codes in rows[pid]:
            layouts[pid][tensor].add(codes)
    by_tensor: dict = {}
    for pid in parts:
        for tensor, ids in layouts[pid].items():
            seen, holders = by_tensor.setdefault(tensor, (set(), []))
            seen |= ids
            holders.append(pid)
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for seen, holders in by_tensor.values():
        if len(seen) > 1:
            root = find(holders[0])
            for pid in holders[1:]:
                if find(pid) != root:
                    parent[find(pid)] = root
    out = defaultdict(list)
    for pid in parent:
        out[find(pid)].append(pid)
    return list(out.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([(0,), (1,), (0, 1)])), max_size=6), min_size=1, max_size=5))
def test_peer_conflicts_read_once_are_the_layout_sets(per_partition):
    rows = {f"p{i}": r for i, r in enumerate(per_partition)}
    parts = tuple(sorted(rows))
    assert place_ranks._conflicting(parts, rows) == _conflicting_by_sets(parts, rows)


def test_assignments_are_solved_once_per_distinct_matrix(monkeypatch):
    calls = []
    solve = assignment.linear_sum_assignment

    def counted(*args, **kwargs):
        calls.append(1)
        return solve(*args, **kwargs)

    monkeypatch.setattr(place_ranks, "linear_sum_assignment", counted)
    rng = np.random.default_rng(7)
    mats = [rng.integers(0, 5, (4, 4)).astype(float) for _ in range(3)]
    solved: dict = {}
    got = [place_ranks._assign(m.copy(), solved) for m in mats + mats + [np.zeros((0, 0))]]
    assert len(calls) == 3
    assert got == [place_ranks._assign(m) for m in mats + mats] + [[]]
    assert len(calls) == 9


def test_trusted_needs_are_the_needs_of_each_row():
    holders = [(Holder(0, "a", 0),), (Holder(1, "b", 0), Holder(2, "b", 0))]
    rows = [(0, 0, Box((0,), (2,)), 1), (1, 2, Box((2,), (4,)), 0)]
    got = trusted_needs("w", rows, ((3,), (4, 5)), ("x", "y"), holders)
    want = [Need("w", Box((0,), (2,)), (3,), "x", 0, holders[1]), Need("w", Box((2,), (4,)), (4, 5), "y", 2, holders[0])]
    assert got == want and all(type(n) is Need for n in got)
    assert [attrs.asdict(n, recurse=False) for n in got] == [attrs.asdict(n, recurse=False) for n in want]


def test_a_fills_tensor_is_found_by_bisection():
    dst = ptc_from_spec("gpt-1.3b:tp2,pp2,dp1,layers=2@1x4")
    for s in dst.subtensors:
        assert _tensor_of(dst, s.id) == s.tensor
    with pytest.raises(KeyError):  # as the map did
        _tensor_of(dst, "no/such")
