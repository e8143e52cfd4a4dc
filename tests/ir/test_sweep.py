"""overlapping_pairs: equal to the brute-force all-pairs answer, deterministic, and not all-pairs."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.ir import Box, overlapping_pairs
from tests.strategies import box_lists


def brute_force(a: list[Box], b: list[Box]) -> set[tuple[int, int]]:
    return {(i, j) for i, x in enumerate(a) for j, y in enumerate(b) if not x.empty and not y.empty and x.overlaps(y)}


@given(st.integers(0, 3).flatmap(lambda n: st.tuples(box_lists(n, max_size=12), box_lists(n, max_size=12))))
def test_overlapping_pairs_equals_brute_force(ab):
    a, b = ab
    pairs = list(overlapping_pairs(a, b))
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == brute_force(a, b)
    assert list(overlapping_pairs(a, b)) == pairs  # deterministic order


EXAMPLES = [
    pytest.param([], [Box((0,), (1,))], [], id="empty_side"),
    pytest.param([Box((), ())], [Box((), ()), Box((), ())], [(0, 0), (0, 1)], id="scalars"),
    pytest.param([Box((0,), (2,))], [Box((2,), (4,))], [], id="touching_is_not_overlapping"),
    pytest.param([Box((0, 0), (4, 2))], [Box((1, 2), (3, 4))], [], id="disjoint_in_dim_1_only"),
    pytest.param([Box((1,), (1,))], [Box((0,), (4,))], [], id="empty_box_ignored"),
    pytest.param([Box((0,), (4,)), Box((4,), (8,))], [Box((3,), (5,))], [(0, 0), (1, 0)], id="straddle"),
]


@pytest.mark.parametrize("a, b, expected", EXAMPLES)
def test_overlapping_pairs_examples(a, b, expected):
    assert sorted(overlapping_pairs(a, b)) == expected


def test_sweep_is_not_all_pairs(monkeypatch):
    n = 2000
    a = [Box((i, 0), (i + 1, 4)) for i in range(n)]
    calls = 0
    overlaps = Box.overlaps

    def counting(self, other):
        nonlocal calls
        calls += 1
        return overlaps(self, other)

    monkeypatch.setattr(Box, "overlaps", counting)
    assert sorted(overlapping_pairs(a, a)) == [(i, i) for i in range(n)]
    assert calls <= 2 * n
