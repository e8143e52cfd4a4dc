"""`tenplex verify`: a compiled plan passes check_plan and the arange oracle (and z3 when asked);
a tampered plan fails with one error line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def plan(tenplex, files) -> str:
    path = Path(files["dir"]) / "plan.json"
    code, _, err = tenplex("compile", files["src"], files["dst"], "-o", str(path))
    assert code == 0, err
    return str(path)


def test_compiled_plan_verifies_and_executes(tenplex, files, plan):
    code, out, err = tenplex("verify", plan, files["src"], files["dst"])
    assert code == 0, err
    assert "exact cover: ok" in out
    assert "execution: ok (in-process on arange sources, 192 B of dst state" in out
    assert out.splitlines()[-1] == "plan verified: 13 ops, 2 messages in 1 round; network 88 B (lower bound 88 B)"


def test_large_state_skips_execution(tenplex, files, plan):
    code, out, _ = tenplex("verify", plan, files["src"], files["dst"], "--execute-limit", "100")
    assert code == 0
    assert "execution: skipped (dst state 192 B exceeds --execute-limit 100 B)" in out
    assert "plan verified:" in out


def test_huge_limit_with_too_little_memory_skips_execution(tenplex, files, plan, monkeypatch):
    """`--execute-limit 100TiB` lets any state through the limit; the in-process run then must
    not be started when the machine cannot hold it (it died of MemoryError or the OOM killer)."""
    from tenplex.cli import plans

    monkeypatch.setattr(plans, "available_memory", lambda: 500)
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--execute-limit", "100TiB")
    assert code == 0, err
    assert "execution: skipped (the in-process run needs about 816 B of memory; 500 B available)" in out
    assert out.splitlines()[-1].startswith("plan verified:")


def test_running_out_of_memory_while_executing_skips_execution(tenplex, files, plan, monkeypatch):
    import tenplex.runtime.oracle as oracle

    def exhausted(*_):
        raise MemoryError

    monkeypatch.setattr(oracle, "check_execution", exhausted)
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--execute-limit", "100TiB")
    assert code == 0, err
    assert "execution: skipped (ran out of memory; the in-process run needs about 816 B)" in out


@pytest.mark.parametrize(
    "limit, message",
    [
        pytest.param("9" * 5000, "'99999999999999999999...' is too large: sizes go up to 8 EiB", id="5000_digits"),
        pytest.param(str(1 << 63), "'9223372036854775808' is too large: sizes go up to 8 EiB", id="2_to_the_63"),
        pytest.param("8388608TiB", "'8388608TiB' is too large: sizes go up to 8 EiB", id="8_EiB_in_TiB"),
        pytest.param("-1", "'-1' is not a size such as 65536, 64KiB, 64MiB or 1GiB", id="negative"),
    ],
)
def test_huge_or_malformed_limit_is_a_usage_error(tenplex, files, plan, limit, message):
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--execute-limit", limit)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def _drop(kind: str):
    """Delete the first op of `kind`, renumbering the later ops and their references."""

    def tamper(doc: dict) -> None:
        i = next(op["id"] for op in doc["ops"] if op["kind"] == kind)
        doc["ops"].pop(i)
        for op in doc["ops"][i:]:
            op["id"] -= 1
        for m in doc["messages"]:
            m["ops"] = [j - (j > i) for j in m["ops"] if j != i]
        doc["edges"] = [[a - (a > i), b - (b > i), k] for a, b, k in doc["edges"] if i not in (a, b)]

    return tamper


def _shrink_a_box(doc: dict) -> None:
    doc["ops"][0]["box"][0][1] -= 1


def _wrong_source(doc: dict) -> None:
    doc["ops"][0]["src_device"] = 3


TAMPER = [
    pytest.param(_drop("value"), "value 'iteration' of partition 'tp0' on device 0 is set 0 times", id="drop_value_op"),
    pytest.param(_drop("copy"), "has 8 elements but the plan writes 0", id="drop_copy_op"),
    pytest.param(_drop("fill"), "fill region of shape (2, 4) has 4 elements but the plan writes 0", id="drop_fill_op"),
    pytest.param(_shrink_a_box, "has 8 elements but the plan writes 4", id="shrink_box"),
    pytest.param(
        _wrong_source, "reads src sub-tensor 'emb/tp0' on device 3, which does not hold it", id="wrong_source"
    ),
]


@pytest.mark.parametrize("tamper, message", TAMPER)
def test_tampered_plan_fails(tenplex, files, plan, tamper, message):
    doc = json.loads(Path(plan).read_text())
    tamper(doc)
    Path(plan).write_text(json.dumps(doc))
    code, out, err = tenplex("verify", plan, files["src"], files["dst"])
    assert code == 2 and out == ""
    assert err.startswith("tenplex: error: ") and err.count("\n") == 1
    assert message in err


def test_verify_against_the_wrong_dst_fails(tenplex, files, plan):
    code, _, err = tenplex("verify", plan, files["src"], files["src"])
    assert code == 2 and err.startswith("tenplex: error: plan allocation")


def test_z3_certificate(tenplex, files, plan):
    pytest.importorskip("z3")
    pytest.importorskip("proofs.certificate")
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--z3")
    assert code == 0, err
    assert "z3 certificate: ok (8 dst instances" in out
