"""The convergence experiment, tiny: 2 -> 1 -> 2 processes over 3 steps of a 1-layer GPT."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "convergence.py"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_tiny_convergence_experiment(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("convergence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--steps", "3", "--small", "--out", str(tmp_path),
                          "--program-args", "--samples", "64", "--layers", "1"])  # fmt: skip
    assert result["same_samples_every_step"] and result["max_rel_loss_diff"] < 1e-4
    assert [r["W"] for r in result["elastic"]] == [2, 1, 2] and len(result["reconfigurations"]) == 2
    assert (tmp_path / "convergence.png").stat().st_size > 0
    assert json.loads((tmp_path / "convergence.json").read_text())["steps"] == 3
    # every controller line says which run it belongs to (issue 13, item 9)
    lines = capsys.readouterr().out.splitlines()[:-1]  # the last line is the experiment's result
    assert lines and all(line.startswith(("static run: ", "elastic run: ")) for line in lines), lines
    assert "static run: generation 0: tp2 dp1 (W=2): starting torchrun on 2 processes" in "\n".join(lines)
