"""The runtime's bench tables on tiny cases: every figure is there, the moved bytes are checked."""

from __future__ import annotations

import pytest

from tenplex.runtime.transport.ucx import ucx_available

TINY = "gpt-tiny:hidden=64,ffn=256"


def test_slices_table_measures_each_agents_share_against_the_whole_plan():
    from bench.slices import measure

    r = measure(f"{TINY},tp2,pp1,dp1@2x1", f"{TINY},tp1,pp2,dp1@2x1")
    assert r["hosts"] == 2 and r["ops"] > 0 and r["agent_regions"] > 0
    assert 0 < r["agent_bytes"] < r["whole_bytes"]  # an agent gets less than the whole plan and PTCs
    assert r["agent_s"] >= 0 and r["whole_s"] > 0 and r["ratio"] > 0


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(ucx_available() is not None, reason="ucxx cannot be imported")
def test_execute_table_times_repeated_executes_and_checks_the_bytes():
    from bench.execute import fmt, measure_execute

    r = measure_execute(TINY, 2)
    assert r["checked_bytes"] > 0 and r["ops"] > 0
    assert 0 < r["ms"]["min"] <= r["ms"]["median"] <= r["ms"]["max"]
    assert r["prepare_ms"]["max"] <= r["ms"]["max"]
    assert 0 < r["cpu_ms"]["min"] <= r["cpu_ms"]["max"]  # the runtime and the agents did work
    assert fmt(r["ms"], "").count(" / ") == 2


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(ucx_available() is not None, reason="ucxx cannot be imported")
def test_agents_table_has_fresh_reserved_repeated_its_cpu_and_the_fresh_memcpy_anchor():
    from bench.execute import measure_agents

    r = measure_agents(TINY, 1)
    assert r["checked_bytes"] > 0 and r["moved_bytes"] > 0
    assert {k: len(v) for k, v in r["all"].items()} == dict.fromkeys(
        ("fresh", "reserved", "repeated", "fresh_vs_fresh", "fresh_vs_memfd", "repeated_cpu", "limit", "repeated_vs_limit"), 1
    )
    assert all(v[0] > 0 for v in r["all"].values())
    kinds = r["limit_kinds"]  # the copy limit split into flat and strided copies: every moved byte once
    assert kinds["flat"]["bytes"] + kinds["strided"]["bytes"] == r["moved_bytes"]
    assert kinds["strided"]["bytes"] > 0 and all(k["gbps"] > 0 for k in kinds.values())  # TP2 -> PP2 has column blocks
