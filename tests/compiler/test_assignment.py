"""`tenplex.compiler.assignment.linear_sum_assignment` returns scipy's answer on every input:
ties (the pick among equal optima is part of a plan), integers, floats, infinities, tall and
wide matrices, maximize, and scipy's errors. `tenplex compile` then never imports scipy."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tenplex.compiler.assignment import linear_sum_assignment

scipy_optimize = pytest.importorskip("scipy.optimize")


def _matrices(rng: np.random.Generator, kind: int, shape: tuple[int, int]) -> np.ndarray:
    if kind == 0:
        return rng.integers(0, 3, shape).astype(float)  # heavy ties
    if kind == 1:
        return rng.random(shape)
    if kind == 2:
        return rng.integers(-5, 5, shape)  # an integer array
    if kind == 3:
        return np.round(rng.random(shape), 1) * 1e12  # large values, ties
    if kind == 4:
        return rng.integers(0, 2, shape) + 0.1 * np.eye(*shape)  # place-ranks' identity bonus
    if kind == 5:
        return np.kron(rng.integers(0, 4, (2, 2)), np.ones((shape[0] // 2 + 1, shape[1] // 2 + 1)))  # DP replicas
    m = rng.integers(0, 4, shape).astype(float)
    m[rng.random(shape) < 0.3] = np.inf  # forbidden pairs; sometimes no finite assignment
    return m


def _same(cost, maximize: bool) -> None:
    try:
        want = scipy_optimize.linear_sum_assignment(cost, maximize=maximize)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e))):
            linear_sum_assignment(cost, maximize=maximize)
        return
    got = linear_sum_assignment(cost, maximize=maximize)
    assert [a.tolist() for a in got] == [a.tolist() for a in want], (cost, maximize)
    assert [a.dtype for a in got] == [a.dtype for a in want]


@pytest.mark.parametrize("kind", range(7))
def test_random_matrices_are_scipys(kind):
    rng = np.random.default_rng(kind)
    for _ in range(400):
        cost = _matrices(rng, kind, tuple(int(n) for n in rng.integers(1, 10, 2)))
        _same(cost, maximize=False)
        _same(-cost if kind == 6 else cost, maximize=True)


@pytest.mark.parametrize("n", [24, 96])
def test_large_tied_matrices_are_scipys(n):
    rng = np.random.default_rng(n)
    replicas = np.kron(rng.integers(0, 3, (n // 8, n // 8)), np.ones((8, 8))) * 2**30
    for cost in (replicas, replicas + 0.5 / n * np.eye(n), rng.integers(0, 2, (n, n // 2))):
        _same(cost, maximize=True)


def test_degenerate_inputs_are_scipys():
    for cost in (np.zeros((0, 3)), np.zeros((3, 0)), np.zeros((4, 4)), np.full((3, 5), 7.0), [[1.0]]):
        _same(cost, maximize=False)
        _same(cost, maximize=True)
    for bad in ([[np.nan, 1.0]], [[-np.inf, 1.0]], [[np.inf, np.inf]], np.zeros(3), np.zeros((2, 2, 2))):
        _same(bad, maximize=False)
    _same([[np.inf, 1.0]], maximize=True)  # +inf is -inf once negated


def test_compile_imports_no_scipy():
    script = ("import sys; from tenplex.cli.app import cli; "
              "cli.main(['compile', 'gpt-tiny:tp2@2x2', 'gpt-tiny:tp1,pp2,dp2@2x2'], standalone_mode=False); "
              "print('scipy' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
