"""`tenplex compile`: each emitter to stdout and to a file, options, determinism, and errors
that print one line, exit 2 and leave no output file; pictures (svg, png) and the committed
picture of the README; progress only on a terminal."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from tenplex.compiler import plan_from_json
from tests.cli.conftest import dst_doc, src_doc, write


def test_json_to_stdout_is_a_plan_with_the_dst_allocation(tenplex, files):
    code, out, err = tenplex("compile", files["src"], files["dst"])
    assert code == 0, err
    plan = plan_from_json(json.loads(out))
    assert plan.allocation.mapping == {"tp0": (0,), "tp1": (1,), "tp2": (2,), "tp3": (3,)}
    assert plan.stats.network_bytes == plan.stats.network_lower_bound_bytes == 88


_PLOTS = pytest.mark.skipif(not __import__("importlib").util.find_spec("matplotlib"), reason="needs matplotlib")


@pytest.mark.parametrize("emit", ["json", "dot", "text", pytest.param("svg", marks=_PLOTS)])
def test_output_file_equals_stdout(tenplex, files, emit):
    target = Path(files["dir"]) / f"plan.{emit}"
    code, out, _ = tenplex("compile", files["src"], files["dst"], "--emit", emit)
    assert code == 0
    code, out_o, err = tenplex("compile", files["src"], files["dst"], "--emit", emit, "-o", str(target))
    assert code == 0 and out_o == ""
    assert f"wrote {target}" in err
    assert target.read_text() == out
    assert not [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")]


def test_compile_is_deterministic(tenplex, files):
    outputs = [tenplex("compile", files["src"], files["dst"])[1] for _ in range(2)]
    assert outputs[0] == outputs[1]


def test_text_summary(tenplex, files):
    code, out, _ = tenplex("compile", files["src"], files["dst"], "--emit", "text")
    assert code == 0
    assert "ops:            13 (8 copies, 1 fill, 4 values)" in out
    assert "network bytes:  88 B vs lower bound 88 B: 1.000x" in out
    assert "predicted time:" in out and "bandwidth lower bound" in out
    assert re.search(r"h1 +0 B +88 B +88 B", out)
    assert "fills:          8 B in 1 fill op" in out
    assert "rank placement: as in dst" in out
    assert "\x1b[" not in out and "[bold" not in out  # plain text, no markup


def test_dot_has_one_cluster_per_host(tenplex, files):
    code, out, _ = tenplex("compile", files["src"], files["dst"], "--emit", "dot")
    assert code == 0
    assert out.startswith("digraph plan {") and out.rstrip().endswith("}")
    assert re.findall(r'subgraph "(cluster_[^"]+)"', out) == ["cluster_h0", "cluster_h1"]
    assert '"d1" -> "d2" [label="48 B", style=bold' in out
    assert '"d0" -> "d1" [label="48 B", style=dashed' in out
    assert '"agent h0" -> "agent h1" [label="round 0: 1 message, 88 B", style=bold' in out
    assert '"agent h0" -> "agent h0" [label="round 0: 1 message, 96 B", style=dashed' in out


@_PLOTS
def test_png_to_a_file_is_a_png_and_the_same_each_time(tenplex, files):
    images = []
    for name in ("a.png", "b.png"):
        target = Path(files["dir"]) / name
        code, out, err = tenplex("compile", files["src"], files["dst"], "--emit", "png", "-o", str(target))
        assert code == 0 and out == "" and f"wrote {target}" in err
        images.append(target.read_bytes())
    assert images[0].startswith(b"\x89PNG\r\n\x1a\n") and images[0] == images[1]


@pytest.mark.parametrize("output", [pytest.param([], id="no_output"), pytest.param(["-o", "-"], id="stdout")])
def test_png_needs_an_output_file(tenplex, files, output):
    code, out, err = tenplex("compile", files["src"], files["dst"], "--emit", "png", *output)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--emit png writes an image: give -o FILE" in err


README_PICTURE = ["compile", "gpt-1.3b:tp4,pp2,dp1@2x4", "gpt-1.3b:tp4,pp2,dp2@4x4", "--emit", "svg"]


@_PLOTS
def test_the_committed_picture_is_what_the_command_draws_today(tenplex):
    """docs/img/plan.svg (in the README) is `tenplex compile ... --emit svg -o docs/img/plan.svg`."""
    code, out, err = tenplex(*README_PICTURE)
    committed = Path(__file__).resolve().parents[2] / "docs" / "img" / "plan.svg"
    assert code == 0, err
    assert out == committed.read_text(), (
        "the picture changed: run `tenplex " + " ".join(README_PICTURE) + " -o docs/img/plan.svg` and commit it"
    )


def test_progress_is_shown_only_on_a_terminal(tenplex, files, monkeypatch):
    from rich.console import Console

    from tenplex.cli import plans

    code, out, err = tenplex("compile", files["src"], files["dst"])
    assert code == 0 and err == ""  # the test runner's stderr is no terminal: no spinner
    screen = io.StringIO()
    monkeypatch.setattr(plans, "_console", lambda: Console(file=screen, force_terminal=True, width=100))
    code, again, err = tenplex("compile", files["src"], files["dst"])
    assert code == 0 and err == "" and again == out
    assert "writing the plan as json" in screen.getvalue()  # the last state, drawn once more as it stops


def test_options_reach_the_plan(tenplex, files):
    args = ["--no-place-ranks", "--max-message-bytes", "64KiB", "--memory-budget", "1MiB", "--baseline", "reference"]
    code, out, err = tenplex("compile", files["src"], files["dst"], *args)
    assert code == 0, err
    assert json.loads(out)["options"] == {
        "place_ranks": False,
        "max_message_bytes": 65536,
        "memory_budget_bytes": 1 << 20,
        "baseline": "reference",
    }


def _broken_json(tmp: Path) -> str:
    doc = src_doc()
    doc["subtensors"]["w/tp0"]["box"] = [[0, 4], [0, 9]]
    return write(tmp / "broken.json", doc)


def _unknown_key(tmp: Path) -> str:
    doc = src_doc()
    doc["subtensors"]["w/tp0"]["shard"] = 1
    return write(tmp / "unknown.json", doc)


def _other_shape(tmp: Path) -> str:
    doc = dst_doc()
    doc["tensors"]["w"]["shape"] = [8, 6]
    for k in range(4):
        doc["subtensors"][f"w/tp{k}"]["box"][1] = [0, 6]
    return write(tmp / "wide.json", doc)


def _bad_dtype(tmp: Path) -> str:
    doc = src_doc()
    doc["tensors"]["w"]["dtype"] = "float33"
    return write(tmp / "bad_dtype.json", doc)


def _not_json(tmp: Path) -> str:
    (tmp / "bad.json").write_text('{"format": ')
    return str(tmp / "bad.json")


ERRORS = [
    pytest.param(
        lambda t: str(t / "missing.json"),
        None,
        "missing.json: cannot read: No such file or directory",
        id="missing_file",
    ),
    pytest.param(_not_json, None, "bad.json: not valid JSON", id="not_json"),
    pytest.param(
        _broken_json,
        None,
        "sub-tensor 'w/tp0' piece 0 global box [[0, 4], [0, 9]] is outside tensor 'w'",
        id="box_outside_tensor",
    ),
    pytest.param(_bad_dtype, None, "bad_dtype.json: tensors['w']: unknown dtype 'float33'", id="bad_dtype"),
    pytest.param(_unknown_key, None, "subtensors['w/tp0']: unknown key 'shard'", id="unknown_key"),
    pytest.param(
        None, _other_shape, "tensor 'w' is float32[8, 4] in src but float32[8, 6] in dst", id="shape_mismatch"
    ),
    pytest.param(None, lambda t: "gpt-tiny:tp3@1x4", "spec 'gpt-tiny:tp3@1x4'", id="bad_spec"),
]


@pytest.mark.parametrize("make_src, make_dst, message", ERRORS)
def test_errors_are_one_line_and_leave_no_file(tenplex, files, tmp_path, make_src, make_dst, message):
    src = make_src(tmp_path) if make_src else files["src"]
    dst = make_dst(tmp_path) if make_dst else files["dst"]
    target = tmp_path / "out" / "plan.json"
    target.parent.mkdir()
    code, out, err = tenplex("compile", src, dst, "-o", str(target))
    assert code == 2 and out == ""
    assert err.startswith("tenplex: error: ") and err.count("\n") == 1
    assert message in err
    assert list(target.parent.iterdir()) == []


USAGE = [
    pytest.param(["compile", "a.json"], "Missing argument 'DST'", id="missing_argument"),
    pytest.param(["compile", "a", "b", "--emit", "xml"], "Invalid value for '--emit'", id="bad_choice"),
    pytest.param(["compile", "a", "b", "--max-message-bytes", "2GB"], "'2GB' is not a size", id="bad_size"),
    pytest.param(["frobnicate"], "No such command 'frobnicate'", id="unknown_command"),
    pytest.param(["spec"], "give either SPEC or --list", id="spec_without_argument"),
]


@pytest.mark.parametrize("args, message", USAGE)
def test_usage_errors_are_one_line_exit_2(tenplex, args, message):
    code, out, err = tenplex(*args)
    assert code == 2 and out == ""
    assert err.startswith("tenplex: error: ") and err.count("\n") == 1
    assert message in err and "--help" in err


def test_inconsistent_sizes_are_an_error(tenplex, files):
    code, _, err = tenplex("compile", files["src"], files["dst"], "--max-message-bytes", "2GiB")
    assert code == 2
    assert err == "tenplex: error: need 1 <= max_message_bytes (2147483648) <= memory_budget_bytes (1073741824)\n"


def test_unwritable_output(tenplex, files, tmp_path):
    code, _, err = tenplex("compile", files["src"], files["dst"], "-o", str(tmp_path / "no" / "such" / "plan.json"))
    assert code == 2
    assert err.endswith("plan.json: cannot write: No such file or directory\n")


def test_a_plan_is_not_a_ptc(tenplex, files, tmp_path):
    plan = tmp_path / "plan.json"
    assert tenplex("compile", files["src"], files["dst"], "-o", str(plan))[0] == 0
    code, _, err = tenplex("compile", str(plan), files["dst"])
    assert code == 2 and "format: expected 'tenplex.ptc/1' (a PTC)" in err and "'tenplex.plan/1'" in err


def test_no_arguments_prints_help(tenplex):
    code, out, _ = tenplex()
    assert code == 0 and "compile" in out and "verify" in out and "inspect" in out
