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
    summary = lines[lines.index("Summary") + 1 :]
    assert re.fullmatch(
        r"  paper cases: 1/1 plans verified at the network lower bound; .* for reference Tenplex \(\d+% less\)",
        summary[0],
    )
    assert re.fullmatch(r"  small GPT: +3/3 reconfigurations executed in-process, .* byte for byte", summary[1])
    assert re.fullmatch(
        r"  agents: +(2/2 reconfigurations executed by 2 agent processes over UCX, .* byte for byte"
        r"|skipped \(ucxx cannot be imported: .*\))",
        summary[2],
    )
    assert ("3. gpt-tiny: the first 2 reconfigurations of part 2 (on one host's 4 devices) executed by 2 local agent "
            "processes over UCX") in text  # fmt: skip
    assert "network bytes:  " in text and ": 1.000x" in text  # the to_text summary of one step
    assert (tmp_path / "plan.dot").read_text().startswith("digraph")
    assert re.search(r"^demo OK in ", text, re.MULTILINE)


def test_each_part_prints_its_title_before_its_table_and_nothing_else_first(tmp_path):
    # issue 13, item 9: the controller's lines came before the demo's header, unlabelled
    out = io.StringIO()
    demo.main(["--quick", "--jobs", "1", "--out", str(tmp_path)], stream=out)
    titles = [line for line in out.getvalue().splitlines() if re.match(r"\d\. ", line)]
    assert [t[:2] for t in titles] == ["1.", "2.", "3.", "4.", "5.", "6.", "7."]
    assert titles[4].startswith("5. Emulated hosts") and titles[5].startswith("6. Elastic job")
    text = out.getvalue()
    assert text.index("5. Emulated hosts") < text.index("  skipped: not in --quick") < text.index("6. Elastic job")


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


def test_the_summary_names_the_elastic_run():
    out = io.StringIO()
    elastic = {"reconfigurations": [{}, {}], "max_rel_loss_diff": 0.0, "same_samples_every_step": True}
    demo.headline(demo.Printer(out), [], [], None, "", elastic)
    assert ("  elastic job: 2 reconfigurations of a training job, max relative loss difference 0 vs a static run, "
            "the same samples every step") in out.getvalue()  # fmt: skip
