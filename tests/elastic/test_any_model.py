"""Any model, made elastic by its own declaration: two models tenplex knows nothing of (other module
names, biases, norms without bias, a tied head, an MLP without attention; `other_models.py`) train
through tp, pp and dp changes with their state in the store, and log the same losses and the same
global samples at every step as a static run."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.convergence import Scenario, compare

PROGRAM = Path(__file__).with_name("other_models.py")
ARGS = ["--samples", "64", "--layers", "2", "--hidden", "32"]
SCENARIOS = {
    # tp 2 -> pp 2 -> dp 2: every kind of parallelism changes
    "untied": Scenario(2, {"2": [2, 1, 1]}, ((1 / 3, {"devices": 2, "pp": 2}), (2 / 3, {"devices": 2, "tp": 1, "pp": 1}))),
    # tp 2 -> dp 2 -> tp 2 (the tied head keeps the whole model on one stage)
    "tied": Scenario(2, {"2": [2, 1, 1]}, ((1 / 3, {"devices": 2, "tp": 1, "pp": 1}), (2 / 3, {"devices": 2, "tp": 2}))),
}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", sorted(SCENARIOS))
def test_a_model_tenplex_never_saw_trains_the_same_elastically(tmp_path, model):
    lines: list[str] = []
    result = compare(tmp_path, 6, [*ARGS, "--model", model], SCENARIOS[model], lines.append, program=PROGRAM)
    configs = [(r["tp"], r["pp"], r["dp"]) for r in result["elastic"]]
    expected = {"untied": [(2, 1, 1)] * 2 + [(1, 2, 1)] * 2 + [(1, 1, 2)] * 2, "tied": [(2, 1, 1)] * 2 + [(1, 1, 2)] * 2 + [(2, 1, 1)] * 2}
    assert configs == expected[model]
    assert result["same_samples_every_step"], "the elastic run read other samples than the static run"
    assert result["max_rel_loss_diff"] < 1e-4, result["max_rel_loss_diff"]
    assert len(result["reconfigurations"]) == 2 and all(r["bytes_moved"] > 0 for r in result["reconfigurations"])
    assert any("peer to peer between the agents' stores" in line for line in lines)
