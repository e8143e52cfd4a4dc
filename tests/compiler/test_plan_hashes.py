"""Compiled plans stay byte-identical: the suite's subset of the golden plan hashes
(`tests.compiler.plan_hashes`; `python -m tests.compiler.plan_hashes` checks all of them)."""

from __future__ import annotations

from tests.compiler.plan_hashes import hashes, load_golden, problem_set


def test_plans_match_their_golden_hashes():
    golden = load_golden()
    changed = [name for name, build in problem_set(quick=True) if hashes(*build()) != golden[name]]
    assert not changed, f"plans or inputs changed: {changed} (see `python -m tests.compiler.plan_hashes`)"
