"""Smoke test of the bytes benchmark, in-process on tiny models: the plan's network bytes equal
the lower bound and the reference baseline never moves fewer bytes."""

import pytest

from bench.cases import paper_cases
from bench.measure import measure_bytes, measure_compile
from bench.report import BYTES_HEADERS, COMPILE_HEADERS, bytes_row, compile_row, md_table, text_table

TINY = paper_cases(("gpt-tiny",), ",heads=8")  # heads=8 so that TP8 divides them


@pytest.mark.parametrize("case", TINY, ids=[c.name for c in TINY])
def test_bytes_equal_lower_bound(case):
    r = measure_bytes(case.src, case.dst)
    assert r["network_bytes"] == r["lower_bound_bytes"] == r["stats_lower_bound_bytes"], r
    assert r["equal"]
    assert r["reference_network_bytes"] >= r["network_bytes"], r
    row = bytes_row({"name": case.name, "status": "ok", **r})
    assert row[5] == "yes" and len(row) == len(BYTES_HEADERS)
    assert "gpt-tiny" in text_table(BYTES_HEADERS, [row]) and md_table(BYTES_HEADERS, [row]).count("\n") == 2


def test_compile_measurement():
    r = measure_compile(TINY[0].src, TINY[0].dst)
    assert r["compile_s"] >= 0 and r["check_s"] >= 0 and r["peak_rss_bytes"] > 0
    assert r["plan"]["ops"] == sum(r["plan"].get(k, 0) for k in ("CopyOp", "FillOp", "ValueOp"))
    assert len(compile_row({"name": "tiny", "status": "ok", **r})) == len(COMPILE_HEADERS)


def test_failed_rows_keep_their_width():
    timeout = {"name": "gpt-tiny (1,1,1)→(1,1,2)", "status": "timeout", "timeout_s": 1.0}
    assert len(bytes_row(timeout)) == len(BYTES_HEADERS)
    assert len(compile_row(timeout)) == len(COMPILE_HEADERS)
