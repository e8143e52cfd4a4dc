"""(tp, dp[, pp]) -> DTensor layout JSON: the mapping a program declares (`Parallelism`) and the controller
reshards with, and the pipeline stage split, here with the example GPT's declaration."""

import re

import pytest

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.layouts import Parallelism, layout_json
from tenplex.frameworks.dtensor.boxes import Replicate
from tenplex.frameworks.dtensor.layout import TensorSpec, ptc_from_specs
from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_specs
from tenplex.ir.tensor import TensorMeta


def gpt(layers: int) -> Parallelism:
    """The example GPT's own declaration (`examples/elastic_gpt.py: parallelism`), read from it."""
    import importlib.util
    from pathlib import Path

    from tenplex.elastic.api import Job, ParallelConfig

    path = Path(__file__).resolve().parents[2] / "examples" / "elastic_gpt.py"
    spec = importlib.util.spec_from_file_location("elastic_gpt_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.parallelism(Job(Path("unused"), 0, 0, 1, ParallelConfig(1, 1)), layers)


def gpt_plan(layers: int) -> dict[str, str]:
    return gpt(layers).plan


def gpt_stages(layers: int, pp: int) -> dict[str, int]:
    return gpt(layers).stages(pp)


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


def test_a_declaration_round_trips_and_bad_ones_name_the_field():
    par = gpt(2)
    assert Parallelism.from_json(par.to_json(), "p.json") == par
    assert par.layout(2, 1, 2) == layout_json(2, 1, par.plan, 2, par.stages(2))
    for doc, message in [([], "p.json: not a parallelism declaration"), ({"plan": {"x": "diagonal"}}, "style 'diagonal'"),
                         ({"plan": {}, "layers": ["a", "a"]}, "distinct"), ({"plan": {}, "first": "emb"}, "p.json: first")]:  # fmt: skip
        with pytest.raises(ElasticError, match=re.escape(message)):
            Parallelism.from_json(doc, "p.json")
    with pytest.raises(ElasticError, match="declared no pipeline layers"):
        Parallelism({"a": "colwise"}).stages(2)
    assert Parallelism({"a": "colwise"}).layout(2, 2) == layout_json(2, 2, {"a": "colwise"})


def test_gpt_stages_split_blocks_contiguously():
    assert gpt_stages(4, 2) == {"emb": 0, "pos": 0, "blocks.0": 0, "blocks.1": 0, "blocks.2": 1, "blocks.3": 1, "ln_f": 1, "head": 1}
    assert gpt_stages(3, 3) == {"emb": 0, "pos": 0, "blocks.0": 0, "blocks.1": 1, "blocks.2": 2, "ln_f": 2, "head": 2}
    assert set(gpt_stages(2, 1).values()) == {0}


@pytest.mark.parametrize(
    ("args", "message"),
    [((3, 2), "3 layers do not split into pp 2 equal pipeline stages (layers % pp = 1)"),
     ((4, 0), "pp: expected an integer >= 1, got 0")],
)  # fmt: skip
def test_gpt_stages_errors(args, message):
    with pytest.raises(ElasticError, match=re.escape(message)):
        gpt_stages(*args)


def test_layout_pp1_is_unchanged_by_the_pipeline_arguments():
    plan = gpt_plan(2)
    assert layout_json(2, 2, plan) == layout_json(2, 2, plan, pp=1) == layout_json(2, 2, plan, 1, gpt_stages(2, 1))
    assert list(layout_json(2, 2, plan)["placements"])[-1] == "*" and layout_json(2, 2, plan)["mesh"] == [2, 2]


def test_layout_pp2_puts_each_module_on_its_stage():
    layout = layout_json(2, 1, gpt_plan(4), pp=2, stages=gpt_stages(4, 2))
    assert layout["mesh"] == [2, 1, 2]
    p = layout["placements"]
    assert p["model.blocks.0.attn.q.weight"] == ["Stage(0)", "R", "S(0)"]
    assert p["model.blocks.3.attn.o.weight"] == ["Stage(1)", "R", "S(1)"] and p["model.blocks.3.attn.o.bias"] == ["Stage(1)", "R", "R"]
    assert p["optim.state.blocks.2.mlp.up.weight.exp_avg_sq"] == ["Stage(1)", "R", "S(0)"]
    assert p["model.emb.*"] == p["optim.state.pos.*"] == ["Stage(0)", "R", "R"]
    assert p["model.head.*"] == p["optim.state.ln_f.*"] == p["optim.state.blocks.3.*"] == ["Stage(1)", "R", "R"]
    keys = list(p)
    assert keys.index("model.blocks.3.attn.o.weight") < keys.index("model.emb.*") and keys[-1] == "*" and p["*"] == ["R", "R", "R"]
    assert MeshLayout.from_json(layout).to_json() == {"format": "tenplex.dtensor-layout/1", **layout}


def test_layout_pp2_specs_place_state_on_stage_ranks():
    """What `reshard_dcp` makes of the pp=2 layout: exact TP entries win over the stage patterns,
    and step counters (0-d) follow their module's stage."""
    doc = layout_json(2, 1, gpt_plan(2), pp=2, stages=gpt_stages(2, 2))
    shapes = {k: (4,) if ".bias" in k else (4, 4) for k in doc["placements"] if "*" not in k}  # every exact entry
    shapes.update({"model.emb.weight": (8, 4), "model.blocks.1.ln1.weight": (4,), "optim.state.blocks.1.attn.q.weight.step": (),
                   "model.head.weight": (8, 4)})  # fmt: skip
    src = ptc_from_specs(1, [TensorSpec(TensorMeta(n, s, "float32"), (1,), (Replicate(),)) for n, s in shapes.items()])
    layout = MeshLayout.from_json(doc)
    boxes = {s.name: {r: b.to_list() for r, b in s.boxes().items()} for s in dst_specs(src, layout)}
    assert boxes["model.blocks.1.attn.q.weight"] == {2: [[0, 2], [0, 4]], 3: [[2, 4], [0, 4]]}
    assert boxes["model.blocks.1.attn.o.weight"] == {2: [[0, 4], [0, 2]], 3: [[0, 4], [2, 4]]}
    assert boxes["model.blocks.1.ln1.weight"] == {2: [[0, 4]], 3: [[0, 4]]}
    assert boxes["optim.state.blocks.1.attn.q.weight.step"] == {2: [], 3: []}
    assert boxes["optim.state.blocks.0.attn.q.weight.exp_avg"] == {0: [[0, 2], [0, 4]], 1: [[2, 4], [0, 4]]}
    assert boxes["model.emb.weight"] == {0: [[0, 8], [0, 4]], 1: [[0, 8], [0, 4]]}
    assert boxes["model.head.weight"] == {2: [[0, 8], [0, 4]], 3: [[0, 8], [0, 4]]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"pp": 2}, "pp 2: a pipeline layout needs `stages`"),
     ({"pp": 2, "stages": {"blocks.0": 2}}, "stages['blocks.0']: stage 2 is not an integer in [0, 2) (pp = 2)"),
     ({"pp": 2, "stages": {"blocks.0": 0}}, "plan['blocks.1.attn.q']: no pipeline stage for this module or a prefix of it in stages ['blocks.0']"),
     ({"pp": 0, "stages": {}}, "pp: expected an integer >= 1, got 0")],
)  # fmt: skip
def test_layout_pp_errors(kwargs, message):
    with pytest.raises(ElasticError, match=re.escape(message)):
        layout_json(2, 1, {"blocks.0.attn.q": "colwise", "blocks.1.attn.q": "colwise"}, **kwargs)
