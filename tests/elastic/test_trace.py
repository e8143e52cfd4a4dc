"""experiments/trace.py: the simulated trace-driven comparison (tenplex vs dp-only vs static)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "trace.py"
_spec = importlib.util.spec_from_file_location("tenplex_trace_experiment", _PATH)
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)

SETUP = T.Setup(model="gpt-1.3b", restart_s=30.0)


def _clear() -> None:
    for f in (T.tenplex_layout, T.dp_only_layout, T.move):
        f.cache_clear()


def test_deterministic() -> None:
    trace = [(0, 12), (1200, 24), (2400, 16)]
    _clear()
    a = T.run(SETUP, trace, 800)
    _clear()
    b = T.run(SETUP, trace, 800)
    assert a == b
    assert a["simulated"] is True


def test_dp_only_never_beats_tenplex() -> None:
    trace = [(0, 12), (1200, 24), (2400, 16)]
    init = T.tenplex_layout(SETUP, 12)
    for _, g in trace:  # tenplex's choice set contains dp-only's layout, so it is at least as fast
        dp_only = T.dp_only_layout(SETUP, init.tp, init.pp, g)
        assert dp_only is not None and T.tenplex_layout(SETUP, g).step_seconds <= dp_only.step_seconds
    out = T.run(SETUP, trace, 800)
    tx = out["policies"]["tenplex"]["time_to_steps_s"]
    dx = out["policies"]["dp-only"]["time_to_steps_s"]
    assert tx is not None and dx is not None and tx <= dx
    assert out["speedup_tenplex_over_dp_only"] >= 1.0
    # at 16 GPUs dp-only keeps tp1,pp3 and can use only 12 (dp must divide the batch); tenplex uses 16
    assert out["policies"]["tenplex"]["events"][-1]["to"] == "tp1,pp1,dp16"
    assert out["policies"]["dp-only"]["events"][-1]["to"] == "tp1,pp3,dp4"


@pytest.mark.parametrize("trace", [[(0, 16)], [(0, 16), (600, 16), (1200, 16)]])
def test_no_changes_all_equal(trace) -> None:
    out = T.run(SETUP, trace, 300)
    step = T.tenplex_layout(SETUP, 16).step_seconds
    times = [r["time_to_steps_s"] for r in out["policies"].values()]
    assert all(math.isclose(t, 300 * step, rel_tol=1e-12) for t in times)
    assert all(r["reconfiguration_s"] == 0 for r in out["policies"].values())
    assert out["speedup_tenplex_over_dp_only"] == pytest.approx(1.0)


def test_dp_only_waits_when_it_cannot_use_the_count() -> None:
    # 12 GPUs -> tp1,pp3,dp4; with 2 GPUs dp-only's tp·pp = 3 gives dp = 0: it waits; tenplex runs dp2
    trace = [(0, 12), (600, 2)]
    out = T.run(SETUP, trace, 10_000)
    dp_only, tenplex, static = (out["policies"][p] for p in ("dp-only", "tenplex", "static"))
    assert dp_only["events"][0]["to"] is None and dp_only["time_to_steps_s"] is None
    assert static["events"][0]["to"] is None and static["time_to_steps_s"] is None
    assert dp_only["curve"][-1][1] == pytest.approx(600 / T.tenplex_layout(SETUP, 12).step_seconds)
    assert tenplex["events"][0]["to"] == "tp1,pp1,dp2" and tenplex["time_to_steps_s"] is not None
