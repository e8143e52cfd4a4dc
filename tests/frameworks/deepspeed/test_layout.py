"""ZeRO-1/2 flat partitions: the worked example, and the invariants for random groups."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tenplex.frameworks.deepspeed.layout import ALIGN, FlatGroup, Fragment


def test_worked_example():
    g = FlatGroup((("A", 35), ("B", 7), ("C", 21), ("D", 3)), 2)
    assert (g.numel, g.partition_size) == (66, 34)
    assert list(g.fragments(0)) == [Fragment("A", 0, 34, 0)]
    assert list(g.fragments(1)) == [Fragment("A", 34, 35, 0), Fragment("B", 0, 7, 1), Fragment("C", 0, 21, 8), Fragment("D", 0, 3, 29)]
    assert (g.valid(1), g.padding(1)) == (32, 2)


def test_padding_spans_several_trailing_ranks():
    g = FlatGroup((("w", 3),), 4)  # 3 elements padded to 8: partitions of 2
    assert [g.valid(r) for r in range(4)] == [2, 1, 0, 0]
    assert [list(g.fragments(r)) for r in range(2, 4)] == [[], []]


@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 9))
def test_fragments_tile_every_parameter_once(numels, dp):
    g = FlatGroup(tuple((f"p{i}", n) for i, n in enumerate(numels)), dp)
    assert g.partition_size * dp % (ALIGN * dp) == 0 and g.partition_size * dp >= g.numel
    seen = {f"p{i}": [] for i in range(len(numels))}
    for r in range(dp):
        frags = list(g.fragments(r))
        assert g.valid(r) + g.padding(r) == g.partition_size
        at = 0
        for f in frags:  # contiguous from offset 0, in flat order
            assert f.offset == at
            at += f.stop - f.start
            seen[f.name].append((f.start, f.stop))
        assert at == g.valid(r)
    for i, n in enumerate(numels):
        runs = seen[f"p{i}"]
        assert runs[0][0] == 0 and runs[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
