"""The compile table's summaries, on made-up runs: min/median/max per phase, ratios against the
case's goal, and the scaling series' growth exponent (1.00 = linear)."""

from bench.cases import Case
from bench.compiler import summarize
from bench.report import COMPILE_HEADERS, SCALING_HEADERS, compile_row, scaling_rows

PLAN = {"ops": 1000, "CopyOp": 990, "FillOp": 0, "ValueOp": 10, "messages": 10, "rounds": 2}


def run(compile_s: float, check_s: float, ops: int = 1000) -> dict:
    return {"name": "c", "src": "s", "dst": "d", "status": "ok", "build_s": 0.1, "compile_s": compile_s, "check_s": check_s,
            "wall_s": 1.0, "peak_rss_bytes": 1 << 20, "plan": {**PLAN, "ops": ops}}  # fmt: skip


def test_summary_keeps_every_run_and_rates_the_median_against_the_goal():
    row = summarize(Case("c", "s", "d", goal_s=(1.0, 2.0), gpus=8), [run(1.2, 1.0), run(0.6, 3.0), run(0.9, 1.5)])
    assert row["compile_s"] == [1.2, 0.6, 0.9] and row["runs"] == 3 and row["gpus"] == 8
    cells = dict(zip(COMPILE_HEADERS, compile_row(row)))
    assert cells["compile CPU s min/med/max"] == "0.60/0.90/1.20"
    assert cells["compile/goal"] == "0.60x/0.90x/1.20x"
    assert cells["check/goal"] == "0.50x/0.75x/1.50x"
    assert cells["goal"] == "met"  # medians 0.9 <= 1 and 1.5 <= 2
    slow = summarize(Case("c", "s", "d", goal_s=(0.5, None)), [run(1.2, 1.0)] * 3)
    assert dict(zip(COMPILE_HEADERS, compile_row(slow)))["goal"] == "MISSED"


def test_a_failed_run_fails_the_case():
    failed = {"name": "c", "status": "timeout", "timeout_s": 5.0}
    assert summarize(Case("c", "s", "d"), [run(1.0, 1.0), failed])["status"] == "timeout"


def test_scaling_rows_show_the_growth_exponent():
    rows = [summarize(Case("c", "s", "d", gpus=g), [run(t, t / 2, ops=1000 * g)] * 3) for g, t in ((4, 8.0), (1, 2.0), (2, 4.0))]
    table = [dict(zip(SCALING_HEADERS, r)) for r in scaling_rows(rows)]
    assert [r["GPUs"] for r in table] == ["1", "2", "4"]
    assert [r["growth"] for r in table] == ["-", "n^1.00", "n^1.00"]
    quadratic = summarize(Case("c", "s", "d", gpus=2), [run(8.0, 4.0)] * 3)
    assert scaling_rows([rows[1], quadratic])[1][4] == "n^2.00"
