"""`keysort` against numpy's own sorts: the same orders and values on keys of every range
(packed where they fit, numpy's fallback where they do not), ties, negatives and empties."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.compiler import keysort

SPANS = (1, 2, 7, 1000, 10**9, 2**40, 2**62, 2**63 - 1)
keys = st.tuples(st.integers(0, 300), st.sampled_from(SPANS), st.booleans(), st.integers(0, 2**32 - 1))


def _draw(n: int, span: int, signed: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-(span // 2) if signed else 0, span, n, dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(keys)
def test_argsort_unique_member_match_numpy(case):
    a = _draw(*case)
    assert np.array_equal(keysort.argsort(a), np.argsort(a, kind="stable"))
    assert np.array_equal(keysort.unique(a), np.unique(a))
    values, first, inverse = np.unique(a, return_index=True, return_inverse=True)
    got = keysort.unique_first(a)
    assert np.array_equal(got[0], values) and np.array_equal(got[1], first)
    assert np.array_equal(got[2], inverse.reshape(-1))
    s = np.sort(a)
    assert np.array_equal(s[keysort.starts(s)], values)  # one position per run, its first
    assert keysort.starts(s).dtype == np.int64
    probe = _draw(50, case[1], True, case[3] + 1)
    assert np.array_equal(keysort.member(np.unique(a), probe), np.isin(probe, a))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.lists(st.sampled_from(SPANS), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_lexsort_matches_numpy(n, spans, seed):
    ks = [_draw(n, span, i % 2 == 1, seed + i) for i, span in enumerate(spans)]
    assert np.array_equal(keysort.lexsort(ks), np.lexsort(ks))
