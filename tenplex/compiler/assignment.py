"""`linear_sum_assignment`: scipy's assignment solver ported to numpy, answer for answer.

`place-ranks` solves assignment problems whose weights tie (DP replicas hold the same bytes),
so which optimum comes out is part of the plan: this module follows scipy's
`scipy/optimize/rectangular_lsap/rectangular_lsap.cpp` (scipy 1.17, unchanged since 2022)
step by step, so it returns scipy's assignment on every input without importing scipy
(~0.4 s per process). The algorithm is Crouse's shortest augmenting path (DF Crouse, "On
implementing 2D rectangular assignment algorithms", IEEE TAES 52(4), 2016, pp. 1685-1686) as
PM Larsen wrote it for scipy: one augmenting path per row; the columns still to scan are kept
in a list filled in reverse and compacted by moving its last entry into the taken slot; among
columns of equal reduced cost the first one in that list wins, unless one is unassigned (then
the last unassigned one). Each path step is one pass of numpy over those columns, in the same
floating-point operations in the same order as scipy's loop, so ties resolve identically.

Invariants:
- The result equals `scipy.optimize.linear_sum_assignment(cost, maximize)` (tests compare
  thousands of matrices: ties, integers, floats, infinities, rectangular both ways).
- Wide matrices (more columns than rows) are solved as given; tall ones transposed, and the
  pairs returned sorted by row, as scipy does.
"""

from __future__ import annotations

import numpy as np


def linear_sum_assignment(cost, maximize: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols): int64 arrays of the min(rows, cols) pairs of a minimum-cost (maximum with
    `maximize`) assignment, rows ascending. Raises ValueError: not a matrix ("expected a
    matrix"), a NaN or -inf entry (+inf with `maximize`) ("invalid numeric entries"), or no
    finite assignment ("cost matrix is infeasible"): scipy's messages."""
    matrix = np.array(cost, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected a matrix (2-D array), got a {matrix.ndim} array")
    nr, nc = matrix.shape
    if nr == 0 or nc == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    transpose = nc < nr
    if transpose:
        matrix = np.ascontiguousarray(matrix.T)
    if maximize:
        matrix = -matrix
    if np.isnan(matrix).any() or (matrix == -np.inf).any():
        raise ValueError("matrix contains invalid numeric entries")
    col4row = _solve(matrix)
    if transpose:
        order = np.argsort(col4row, kind="stable")  # distinct columns: any sort gives scipy's order
        return col4row[order], order.astype(np.int64)
    return np.arange(len(col4row), dtype=np.int64), col4row


def _solve(cost: np.ndarray) -> np.ndarray:
    """col4row of a matrix with no more rows than columns: scipy's `solve`."""
    nr, nc = cost.shape
    u, v = np.zeros(nr), np.zeros(nc)
    path = np.full(nc, -1, np.int64)
    col4row = np.full(nr, -1, np.int64)
    row4col = np.full(nc, -1, np.int64)
    for row in range(nr):
        sink, min_val, costs, seen_rows, seen_cols = _augmenting_path(cost, u, v, path, row4col, row)
        u[row] += min_val
        seen_rows[row] = False
        u[seen_rows] += min_val - costs[col4row[seen_rows]]
        v[seen_cols] -= min_val - costs[seen_cols]
        j = sink
        while True:  # augment along the path back to `row`
            i = int(path[j])
            row4col[j] = i
            col4row[i], j = j, int(col4row[i])
            if i == row:
                break
    return col4row


def _augmenting_path(cost, u, v, path, row4col, i: int):
    """(sink, min_val, shortest path costs, rows seen, columns seen) from row `i`: scipy's
    `augmenting_path`. Raises ValueError when no column is reachable at a finite cost."""
    nc = cost.shape[1]
    remaining = np.arange(nc - 1, -1, -1)  # reversed: a constant matrix gives the identity
    n = nc
    seen_rows = np.zeros(len(u), bool)
    seen_cols = np.zeros(nc, bool)
    costs = np.full(nc, np.inf)
    min_val = 0.0
    while True:
        seen_rows[i] = True
        cols = remaining[:n]
        reduced = min_val + cost[i, cols] - u[i] - v[cols]
        shorter = reduced < costs[cols]
        path[cols[shorter]] = i
        costs[cols[shorter]] = reduced[shorter]
        now = costs[cols]
        lowest = now.min()
        if lowest == np.inf:
            raise ValueError("cost matrix is infeasible")
        free = (now == lowest) & (row4col[cols] == -1)
        index = n - 1 - int(np.argmax(free[::-1])) if free.any() else int(np.argmax(now == lowest))
        min_val = float(lowest)
        j = int(cols[index])
        seen_cols[j] = True
        if row4col[j] == -1:
            return j, min_val, costs, seen_rows, seen_cols
        i = int(row4col[j])
        remaining[index] = remaining[n - 1]
        n -= 1
