"""`tenplex verify`: a compiled plan passes check_plan and the arange oracle (and z3 when asked);
a tampered plan fails with one error line and exit code EXIT_VERIFY (3), whether the exact
cover, the run on arange sources or the z3 certificate refutes it; `--json` prints the same
facts as one JSON object (`tenplex.verify/1`), also when verification fails."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tenplex.cli.common import EXIT_USAGE, EXIT_VERIFY


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
    assert code == EXIT_VERIFY and out == ""
    assert err.startswith("tenplex: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("tamper, message", TAMPER[:2])
def test_tampered_plan_fails_in_json_too(tenplex, files, plan, tamper, message):
    doc = json.loads(Path(plan).read_text())
    tamper(doc)
    Path(plan).write_text(json.dumps(doc))
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--json")
    assert code == EXIT_VERIFY and err.startswith("tenplex: error: ") and err.count("\n") == 1
    report = json.loads(out)
    assert report["ok"] is False and report["failed"] == "exact cover" and report["format"] == "tenplex.verify/1"
    assert message in report["error"]


def test_verify_against_the_wrong_dst_fails(tenplex, files, plan):
    code, _, err = tenplex("verify", plan, files["src"], files["src"])
    assert code == EXIT_VERIFY and err.startswith("tenplex: error: plan allocation")


def test_an_unreadable_plan_is_bad_input_not_a_failed_verification(tenplex, files, tmp_path):
    code, out, err = tenplex("verify", str(tmp_path / "missing.json"), files["src"], files["dst"], "--json")
    assert code == EXIT_USAGE and out == "" and "missing.json" in err


def test_json_has_the_facts_of_the_text(tenplex, files, plan):
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "format": "tenplex.verify/1",
        "ok": True,
        "exact_cover": {"status": "ok"},
        "execution": {"status": "ok", "dst_state_bytes": 192},
        "z3": None,
        "ops": {"total": 13, "copy": 8, "fill": 1, "value": 4},
        "messages": {"total": 2, "network": 1, "local": 1},
        "rounds": 1,
        "network_bytes": 88,
        "network_lower_bound_bytes": 88,
    }


def test_json_says_why_execution_was_skipped(tenplex, files, plan, monkeypatch):
    code, out, _ = tenplex("verify", plan, files["src"], files["dst"], "--json", "--execute-limit", "100")
    assert code == 0
    assert json.loads(out)["execution"] == {
        "status": "skipped",
        "reason": "execute_limit",
        "dst_state_bytes": 192,
        "limit_bytes": 100,
    }
    from tenplex.cli import plans

    monkeypatch.setattr(plans, "available_memory", lambda: 500)
    code, out, _ = tenplex("verify", plan, files["src"], files["dst"], "--json", "--execute-limit", "100TiB")
    assert json.loads(out)["execution"] == {
        "status": "skipped",
        "reason": "memory",
        "needed_bytes": 816,
        "available_bytes": 500,
    }


def test_a_run_that_differs_from_the_oracle_fails_verification(tenplex, files, plan, monkeypatch):
    import tenplex.runtime.oracle as oracle
    from tenplex.ir.errors import ExecutionError

    def differs(*_):
        raise ExecutionError("sub-tensor 'w/tp2' on device 2 differs from the oracle (first at (0, 0))")

    monkeypatch.setattr(oracle, "check_execution", differs)
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--json")
    assert code == EXIT_VERIFY and err.count("\n") == 1
    assert "execution on arange sources: sub-tensor 'w/tp2' on device 2 differs" in err
    assert json.loads(out)["failed"] == "execution"


def test_z3_certificate(tenplex, files, plan):
    pytest.importorskip("z3")
    pytest.importorskip("tenplex.proofs.certificate")
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--z3")
    assert code == 0, err
    assert "z3 certificate: ok (8 dst instances" in out
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--z3", "--json")
    z3 = json.loads(out)["z3"]
    assert code == 0 and z3["status"] == "ok" and z3["instances"] == z3["total_instances"] == 8 and z3["queries"] >= 16
    assert isinstance(z3["seconds"], float)


def test_a_refuted_z3_certificate_fails_verification(tenplex, files, plan, monkeypatch):
    pytest.importorskip("z3")
    certificate = pytest.importorskip("tenplex.proofs.certificate")

    def refuted(*_):
        raise certificate.CertificateError("dst instance ('w/tp2', 2): index (0, 0) is written 2 times")

    monkeypatch.setattr(certificate, "certify", refuted)
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--z3", "--json")
    assert code == EXIT_VERIFY and "z3 certificate failed: dst instance ('w/tp2', 2)" in err
    assert json.loads(out)["failed"] == "z3 certificate"


def test_z3_without_the_solver_is_a_one_line_error(tenplex, files, plan, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tenplex.proofs.certificate", None)
    code, out, err = tenplex("verify", plan, files["src"], files["dst"], "--z3")
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
    assert "--z3 needs the z3-solver package: pip install 'tenplex[proofs]'" in err


def test_progress_is_shown_only_on_a_terminal(tenplex, files, plan, monkeypatch):
    from rich.console import Console

    from tenplex.cli import plans

    code, _, err = tenplex("verify", plan, files["src"], files["dst"])
    assert code == 0 and err == ""  # the test runner's stderr is no terminal: no spinner
    screen = io.StringIO()
    monkeypatch.setattr(plans, "_console", lambda: Console(file=screen, force_terminal=True, width=100))
    code, out, err = tenplex("verify", plan, files["src"], files["dst"])
    shown = screen.getvalue()  # the spinner's last state, drawn once more as it stops, then cleared
    assert code == 0 and err == "" and "executing the plan on arange sources" in shown
    assert out.splitlines()[-1].startswith("plan verified:")
