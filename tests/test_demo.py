"""`python -m demo --quick` exits 0 and prints its headline lines (part 3 starts two
local agent processes, bounded by the Runtime's timeouts, or says why it is skipped)."""

import io
import re

import pytest

import demo


@pytest.mark.timeout(120)
def test_quick_demo_succeeds_and_prints_headline(tmp_path):
    out = io.StringIO()
    assert demo.main(["--quick", "--jobs", "1", "--out", str(tmp_path)], stream=out) == 0
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "tenplex demo: verified, minimal reconfiguration plans"
    assert re.fullmatch(
        r"  paper cases: 1/1 plans verified at the network lower bound; .* for reference Tenplex \(\d+% less\)",
        lines[1],
    )
    assert re.fullmatch(r"  small GPT: +3/3 reconfigurations executed in-process, .* byte for byte", lines[2])
    assert re.fullmatch(
        r"  agents: +(2/2 reconfigurations executed by 2 agent processes over UCX, .* byte for byte"
        r"|skipped \(ucxx cannot be imported: .*\))",
        lines[3],
    )
    assert "3. gpt-tiny: the same reconfigurations executed by 2 local agent processes over UCX" in text
    assert "network bytes:  " in text and ": 1.000x" in text  # the to_text summary of one step
    assert (tmp_path / "plan.dot").read_text().startswith("digraph")
    assert re.search(r"^demo OK in ", text, re.MULTILINE)


def test_case_at_lower_bound_beats_reference():
    case = demo.run_case("gpt-tiny", (1, 2, 2), "4x4")
    assert case.ok, case.error
    assert case.network == case.bound <= case.bound_as_given <= case.reference


def test_failed_case_fails_the_demo_headline():
    case = demo.Case("gpt-tiny", (1, 1, 1), error="CompileError: boom")
    assert not case.ok
    out = io.StringIO()
    demo.headline(demo.Printer(out), [case], [])
    assert "0/1 plans verified" in out.getvalue()


def test_failed_agent_step_fails_the_headline():
    step = demo.AgentStep(((2, 2, 1), "1x4"), ((1, 2, 2), "1x4"), error="ExecutionError: boom")
    assert not step.ok
    out = io.StringIO()
    demo.headline(demo.Printer(out), [], [], [step], "")
    assert "agents:      0/2 reconfigurations" in out.getvalue()
