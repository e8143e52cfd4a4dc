"""`place_ranks._assign` enumerates small matrices instead of importing scipy (~0.4 s per
process): it must return exactly what `linear_sum_assignment` returns, ties included (a tie
goes to scipy), and `tenplex reshard --workers 2` must then not import scipy."""

from __future__ import annotations

import numpy as np
import pytest

from tenplex.compiler.passes import place_ranks


def _scipy(weights: np.ndarray) -> list[int]:
    from scipy.optimize import linear_sum_assignment

    scale = max(1.0, float(weights.max()) / 1e9)
    scores = weights / scale + 0.5 / len(weights) * np.eye(len(weights))
    rows, cols = linear_sum_assignment(scores, maximize=True)
    return [int(c) for _, c in sorted(zip(rows, cols))]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7])
def test_small_assignments_are_scipys(n):
    rng = np.random.default_rng(n)
    cases = [rng.integers(0, 4, (n, n)) * 2**20, rng.random((n, n)) * 1e12, np.zeros((n, n)),
             np.full((n, n), 7.0), np.ones((n, n)) - np.eye(n)]  # fmt: skip
    cases += [rng.integers(0, 3, (n, n)).astype(float) for _ in range(40)]
    for weights in cases:
        assert place_ranks._assign(weights.astype(float)) == _scipy(weights.astype(float)), weights
    clear = np.diag(np.arange(1.0, n + 1)) * 1e6
    assert (place_ranks._unique_best(clear) is not None) == (n <= place_ranks.SMALL)
    if n > 1:
        assert place_ranks._unique_best(np.ones((n, n))) is None  # every assignment ties: scipy decides
