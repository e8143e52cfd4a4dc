"""(tp, dp) -> DTensor layout JSON: the mapping the example parallelizes with and the controller reshards with."""

import re

import pytest

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.layouts import gpt_plan, layout_json
from tenplex.frameworks.dcp_layout import MeshLayout


def test_gpt_plan_names_megatron_split():
    plan = gpt_plan(2)
    assert plan["blocks.1.attn.q"] == "colwise" and plan["blocks.1.attn.o"] == "rowwise"
    assert plan["blocks.0.mlp.up"] == "colwise" and plan["blocks.0.mlp.down"] == "rowwise"
    assert len(plan) == 12


@pytest.mark.parametrize(("tp", "dp"), [(1, 1), (2, 1), (1, 4), (2, 2)])
def test_layout_mesh_and_placements(tp, dp):
    layout = layout_json(tp, dp, {"blocks.0.attn.q": "colwise", "blocks.0.attn.o": "rowwise"})
    assert layout["format"] == "tenplex.dtensor-layout/1" and layout["mesh"] == [dp, tp]
    p = layout["placements"]
    assert p["model.blocks.0.attn.q.weight"] == ["R", "S(0)"] and p["model.blocks.0.attn.q.bias"] == ["R", "S(0)"]
    assert p["model.blocks.0.attn.o.weight"] == ["R", "S(1)"] and p["model.blocks.0.attn.o.bias"] == ["R", "R"]
    assert p["optim.state.blocks.0.attn.q.weight.exp_avg"] == ["R", "S(0)"]
    assert p["optim.state.blocks.0.attn.o.weight.exp_avg_sq"] == ["R", "S(1)"]
    assert p["*"] == ["R", "R"]
    assert MeshLayout.from_json(layout).mesh == (dp, tp)  # reshard_dcp accepts it


@pytest.mark.parametrize(
    ("args", "message"),
    [((0, 1, {}), "tp: expected an integer >= 1, got 0"),
     ((1, True, {}), "dp: expected an integer >= 1, got True"),
     ((1, 1, {"blocks.0.x": "diagonal"}), "plan['blocks.0.x']: style 'diagonal' is not one of ['colwise', 'rowwise']")],
)  # fmt: skip
def test_layout_errors_name_the_field(args, message):
    with pytest.raises(ElasticError, match=re.escape(message)):
        layout_json(*args)


def test_gpt_plan_rejects_bad_layers():
    with pytest.raises(ElasticError, match="layers: expected an integer >= 1, got 0"):
        gpt_plan(0)
