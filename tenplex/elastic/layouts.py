"""(tp, dp[, pp]) → the DTensor layout a training program's state has on a `([pp,] dp, tp)` device mesh.

A tensor-parallel plan names modules by FQN pattern and style, as torch's `parallelize_module`
takes it: `"colwise"` (a Linear's output features split: `weight` and `bias` `Shard(0)` over
the tp mesh dim) or `"rowwise"` (input features split: `weight` `Shard(1)`, `bias` replicated).
Everything else is replicated. Data parallelism replicates over the dp mesh dim.

`layout_json(tp, dp, plan, pp=1, stages=None)` turns a plan into `reshard_dcp`'s dst layout
(`tenplex.dtensor-layout/1`, see `tenplex.frameworks.dtensor.mesh`) for a state dict
`{"model": model_state, "optim": optimizer_state}` as `get_state_dict` gives it:

- pp == 1: the mesh is `[dp, tp]` (rank r at coordinate (r // tp, r % tp), as
  `init_device_mesh` lays it out), a parameter and its optimizer moments
  (`optim.state.<param fqn>.exp_avg*`) get the same placements, and `"*"` replicates the rest
  (norms, embeddings, step counters);
- pp > 1: the mesh is `[pp, dp, tp]` (rank r at (r // (dp*tp), (r // tp) % dp, r % tp)) and
  pipeline stage s holds only its own modules' state. `stages` maps module-FQN prefixes to
  stages (`gpt_stages`); each TP entry gets `Stage(<its module's stage>)` prepended, then for
  each prefix P, in `stages`' order, `model.P.*` and `optim.state.P.*` are `[Stage(s), R, R]`
  (the exact TP entries win over these patterns), then `"*"` replicates on all three dims.

`gpt_plan(layers)` is the plan of `examples/elastic_gpt.py` and `gpt_stages(layers, pp)` its
stage split; the example parallelizes with them and the controller reshards with them, so the
two cannot drift apart. `example_layers(model, args)` is the layer count a job gives the example.

Invariants:
- tp, dp and pp are integers >= 1; styles are "colwise" or "rowwise";
- patterns are module FQNs (fnmatch), without a trailing ".weight"/".bias";
- pp > 1 needs `stages`, every stage in [0, pp), and a stage for every module of the plan (the
  longest prefix of the module, at a "." boundary, names it);
- `gpt_stages` splits the blocks into pp contiguous equal groups: layers % pp == 0;
- 1 <= layers <= MAX_LAYERS (a plan holds six entries per layer).
"""

from __future__ import annotations

from collections.abc import Mapping

from tenplex.elastic.errors import ElasticError

FORMAT = "tenplex.dtensor-layout/1"
STYLES = {"colwise": {"weight": "S(0)", "bias": "S(0)"}, "rowwise": {"weight": "S(1)", "bias": "R"}}
MOMENTS = ("exp_avg", "exp_avg_sq")
MAX_LAYERS = 10_000


def check_degree(name: str, value: object) -> int:
    """`value` as a parallel degree. Raises ElasticError naming `name` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ElasticError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


def check_layers(layers: object) -> int:
    """`layers` as a layer count. Raises ElasticError unless it is an int in 1..MAX_LAYERS."""
    if check_degree("layers", layers) > MAX_LAYERS:
        raise ElasticError(f"layers: {layers} is more than {MAX_LAYERS}")
    return layers


def example_layers(model: Mapping | None, args: tuple[str, ...], source: str = "<job>") -> int:
    """The example GPT's layer count: the job's model.num_layers, else the program's --layers,
    else 2. Raises ElasticError naming `source` and the field for a value that is no layer count."""
    if model and "num_layers" in model:
        where, value = "job.model.num_layers", model["num_layers"]
    elif "--layers" in args[:-1]:
        where, text = "job.args --layers", args[args.index("--layers") + 1]
        value = int(text) if text.isdecimal() and len(text) < 10 else text
    else:
        return 2
    try:
        return check_layers(value)
    except ElasticError as e:
        raise ElasticError(f"{source}: {where}: {e}") from None


def gpt_plan(layers: int) -> dict[str, str]:
    """The tensor-parallel plan of the example GPT: Megatron's attention and MLP split."""
    plan: dict[str, str] = {}
    for i in range(check_layers(layers)):
        plan.update({f"blocks.{i}.attn.{n}": "colwise" for n in ("q", "k", "v")})
        plan[f"blocks.{i}.attn.o"] = "rowwise"
        plan[f"blocks.{i}.mlp.up"] = "colwise"
        plan[f"blocks.{i}.mlp.down"] = "rowwise"
    return plan


def gpt_stages(layers: int, pp: int) -> dict[str, int]:
    """Module-FQN prefix → pipeline stage of the example GPT: `blocks.{i}` in pp contiguous equal
    groups, `emb`/`pos` on stage 0, `ln_f`/`head` on stage pp-1.

    Raises:
        ElasticError: layers or pp not an integer >= 1, or layers not divisible by pp."""
    check_layers(layers)
    check_degree("pp", pp)
    if layers % pp:
        raise ElasticError(f"layers {layers} do not split into pp {pp} equal pipeline stages (layers % pp = {layers % pp})")
    per_stage = layers // pp
    stages = {"emb": 0, "pos": 0}
    stages.update({f"blocks.{i}": i // per_stage for i in range(layers)})
    stages.update({"ln_f": pp - 1, "head": pp - 1})
    return stages


def layout_json(tp: int, dp: int, plan: Mapping[str, str], pp: int = 1, stages: Mapping[str, int] | None = None) -> dict:
    """The dst layout of a `{"model", "optim"}` state dict under `plan` on a (dp, tp) mesh, or
    with pp > 1 on a (pp, dp, tp) mesh with each module's state on its stage (see above).

    Raises:
        ElasticError: a degree that is not an integer >= 1, an unknown style (names the module),
            pp > 1 without `stages`, a stage outside [0, pp), or a plan module with no stage.
    """
    check_degree("tp", tp)
    check_degree("dp", dp)
    check_degree("pp", pp)
    if pp == 1:
        return {"format": FORMAT, "mesh": [dp, tp], "placements": {**_tp_entries(plan, None), "*": ["R", "R"]}}
    if stages is None:
        raise ElasticError(f"pp {pp}: a pipeline layout needs `stages` (module prefix -> stage, e.g. gpt_stages(layers, pp))")
    _check_stages(stages, pp)
    placements = _tp_entries(plan, stages)
    for prefix, stage in stages.items():
        placements[f"model.{prefix}.*"] = [f"Stage({stage})", "R", "R"]
        placements[f"optim.state.{prefix}.*"] = [f"Stage({stage})", "R", "R"]
    placements["*"] = ["R", "R", "R"]
    return {"format": FORMAT, "mesh": [pp, dp, tp], "placements": placements}


def _tp_entries(plan: Mapping[str, str], stages: Mapping[str, int] | None) -> dict[str, list[str]]:
    """Exact entries for the plan's parameters and their moments; `Stage(s)` first if staged."""
    placements: dict[str, list[str]] = {}
    for module, style in plan.items():
        if style not in STYLES:
            raise ElasticError(f"plan[{module!r}]: style {style!r} is not one of {sorted(STYLES)}")
        stage = [] if stages is None else [f"Stage({_stage_of(module, stages)})"]
        for leaf, placement in STYLES[style].items():
            placements[f"model.{module}.{leaf}"] = [*stage, "R", placement]
            for moment in MOMENTS:
                placements[f"optim.state.{module}.{leaf}.{moment}"] = [*stage, "R", placement]
    return placements


def _check_stages(stages: Mapping[str, int], pp: int) -> None:
    for prefix, stage in stages.items():
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < pp:
            raise ElasticError(f"stages[{prefix!r}]: stage {stage!r} is not an integer in [0, {pp}) (pp = {pp})")


def _stage_of(module: str, stages: Mapping[str, int]) -> int:
    """The stage of the longest prefix of `module` (at a "." boundary) in `stages`."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in stages:
            return stages[prefix]
    raise ElasticError(f"plan[{module!r}]: no pipeline stage for this module or a prefix of it in stages {sorted(stages)[:5]}")
