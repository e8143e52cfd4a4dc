"""(tp, dp) → the DTensor layout a training program's state has on a `(dp, tp)` device mesh.

A tensor-parallel plan names modules by FQN pattern and style, as torch's `parallelize_module`
takes it: `"colwise"` (a Linear's output features split: `weight` and `bias` `Shard(0)` over
the tp mesh dim) or `"rowwise"` (input features split: `weight` `Shard(1)`, `bias` replicated).
Everything else is replicated. Data parallelism replicates over the dp mesh dim.

`layout_json(tp, dp, plan)` turns a plan into `reshard_dcp`'s dst layout
(`tenplex.dtensor-layout/1`, see `tenplex.frameworks.dcp_layout`) for a state dict
`{"model": model_state, "optim": optimizer_state}` as `get_state_dict` gives it: the mesh is
`[dp, tp]` (rank r at coordinate (r // tp, r % tp), as `init_device_mesh` lays it out), a
parameter and its optimizer moments (`optim.state.<param fqn>.exp_avg*`) get the same
placements, and `"*"` replicates the rest (norms, embeddings, step counters).

`GPT_PLAN(layers)` is the plan of `examples/elastic_gpt.py`; the example parallelizes with it and
the controller reshards with it, so the two cannot drift apart.

Invariants:
- tp >= 1 and dp >= 1 are integers; styles are "colwise" or "rowwise";
- patterns are module FQNs (fnmatch), without a trailing ".weight"/".bias".
"""

from __future__ import annotations

from collections.abc import Mapping

from tenplex.elastic.errors import ElasticError

FORMAT = "tenplex.dtensor-layout/1"
STYLES = {"colwise": {"weight": "S(0)", "bias": "S(0)"}, "rowwise": {"weight": "S(1)", "bias": "R"}}
MOMENTS = ("exp_avg", "exp_avg_sq")


def check_degree(name: str, value: object) -> int:
    """`value` as a parallel degree. Raises ElasticError naming `name` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ElasticError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


def gpt_plan(layers: int) -> dict[str, str]:
    """The tensor-parallel plan of the example GPT: Megatron's attention and MLP split."""
    plan: dict[str, str] = {}
    for i in range(check_degree("layers", layers)):
        plan.update({f"blocks.{i}.attn.{n}": "colwise" for n in ("q", "k", "v")})
        plan[f"blocks.{i}.attn.o"] = "rowwise"
        plan[f"blocks.{i}.mlp.up"] = "colwise"
        plan[f"blocks.{i}.mlp.down"] = "rowwise"
    return plan


def layout_json(tp: int, dp: int, plan: Mapping[str, str]) -> dict:
    """The dst layout of a `{"model", "optim"}` state dict under `plan` on a (dp, tp) mesh.

    Raises:
        ElasticError: a degree that is not an integer >= 1, or an unknown style (names the module).
    """
    check_degree("tp", tp)
    check_degree("dp", dp)
    placements: dict[str, list[str]] = {}
    for module, style in plan.items():
        if style not in STYLES:
            raise ElasticError(f"plan[{module!r}]: style {style!r} is not one of {sorted(STYLES)}")
        for leaf, placement in STYLES[style].items():
            placements[f"model.{module}.{leaf}"] = ["R", placement]
            for moment in MOMENTS:
                placements[f"optim.state.{module}.{leaf}.{moment}"] = ["R", placement]
    placements["*"] = ["R", "R"]
    return {"format": FORMAT, "mesh": [dp, tp], "placements": placements}
