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
  stages (`Parallelism.stages`); each TP entry gets `Stage(<its module's stage>)` prepended, then for
  each prefix P, in `stages`' order, `model.P.*` and `optim.state.P.*` are `[Stage(s), R, R]`
  (the exact TP entries win over these patterns), then `"*"` replicates on all three dims.

`Parallelism` is what a program declares once (`Job.declare`): its plan and its pipeline split
(first modules, repeated layers, last modules); the program builds its stages with
`Parallelism.stages(pp)` and the controller reshards with `Parallelism.layout(tp, dp, pp)`, so
the two cannot drift apart, for any model. Nothing here knows a model.

Invariants:
- tp, dp and pp are integers >= 1; styles are "colwise" or "rowwise";
- patterns are module FQNs (fnmatch), without a trailing ".weight"/".bias";
- pp > 1 needs `stages`, every stage in [0, pp), and a stage for every module of the plan (the
  longest prefix of the module, at a "." boundary, names it);
- `Parallelism.stages` splits the layers into pp contiguous equal groups: len(layers) % pp == 0;
- a parallelism names at most MAX_MODULES modules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from tenplex.elastic.errors import ElasticError

FORMAT = "tenplex.dtensor-layout/1"
PARALLEL = "parallel.json"  # saved/gen-N/parallel.json: the program's declared Parallelism
STYLES = {"colwise": {"weight": "S(0)", "bias": "S(0)"}, "rowwise": {"weight": "S(1)", "bias": "R"}}
MOMENTS = ("exp_avg", "exp_avg_sq")
MAX_MODULES = 100_000


def check_degree(name: str, value: object) -> int:
    """`value` as a parallel degree. Raises ElasticError naming `name` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ElasticError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


@attrs.frozen
class Parallelism:
    """How a program parallelizes its model, declared once (`Job.declare`); tenplex derives the
    layout of every later (tp, dp, pp) from it, whatever the model.

    `plan`: module FQN -> "colwise" | "rowwise", the plan the program gives torch's
    `parallelize_module` (other modules are replicated). The pipeline split: `first` modules
    (FQN prefixes) on stage 0, `layers` (the repeated units, in order) split into pp contiguous
    equal groups, `last` modules on stage pp - 1. A model that is never pipelined may leave them
    empty (then pp must be 1)."""

    plan: dict[str, str] = attrs.field(converter=dict, factory=dict)
    first: tuple[str, ...] = attrs.field(converter=tuple, default=())
    layers: tuple[str, ...] = attrs.field(converter=tuple, default=())
    last: tuple[str, ...] = attrs.field(converter=tuple, default=())

    def __attrs_post_init__(self) -> None:
        for module, style in self.plan.items():
            if not isinstance(module, str) or style not in STYLES:
                raise ElasticError(f"plan[{module!r}]: style {style!r} is not one of {sorted(STYLES)}")
        if len(self.plan) > MAX_MODULES or len(self.first) + len(self.layers) + len(self.last) > MAX_MODULES:
            raise ElasticError(f"a parallelism of more than {MAX_MODULES} modules")
        names = [*self.first, *self.layers, *self.last]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ElasticError(f"pipeline modules must be distinct non-empty names, got {names[:8]}")

    def stages(self, pp: int) -> dict[str, int]:
        """Module-FQN prefix -> pipeline stage for `pp` stages (see the class docstring).
        Raises ElasticError when the layers do not split into pp equal groups."""
        check_degree("pp", pp)
        if pp > 1 and not self.layers:
            raise ElasticError(f"pp {pp}: the program declared no pipeline layers (Job.declare(..., layers=[...]))")
        if len(self.layers) % pp:
            raise ElasticError(f"{len(self.layers)} layers do not split into pp {pp} equal pipeline stages "
                               f"(layers % pp = {len(self.layers) % pp})")  # fmt: skip
        per = max(1, len(self.layers) // pp)
        return {**dict.fromkeys(self.first, 0), **{n: i // per for i, n in enumerate(self.layers)},
                **dict.fromkeys(self.last, pp - 1)}  # fmt: skip

    def layout(self, tp: int, dp: int, pp: int = 1, names: Collection[str] | None = None) -> dict:
        """The `tenplex.dtensor-layout/1` of a `{"model", "optim"}` state on a (pp, dp, tp) mesh;
        with `names` (the state's tensor FQNs), only entries for tensors it has (a Linear
        without bias has no `.bias` entry)."""
        doc = layout_json(tp, dp, self.plan, pp, self.stages(pp) if pp > 1 else None)
        if names is not None:
            names = set(names)
            doc["placements"] = {k: v for k, v in doc["placements"].items() if "*" in k or k in names}
        return doc

    def to_json(self) -> dict:
        return {"plan": self.plan, "first": list(self.first), "layers": list(self.layers), "last": list(self.last)}

    @classmethod
    def from_json(cls, doc: object, where: str) -> Parallelism:
        """Raises ElasticError naming `where` for anything but a `to_json` document."""
        if not isinstance(doc, dict) or set(doc) - {"plan", "first", "layers", "last"} or not isinstance(doc.get("plan", {}), dict):
            raise ElasticError(f"{where}: not a parallelism declaration ({{plan, first, layers, last}})")
        try:
            return cls(doc.get("plan", {}), *(_names(doc.get(k, []), f"{where}: {k}") for k in ("first", "layers", "last")))
        except ElasticError as e:
            raise ElasticError(f"{where}: {e}") from None


def _names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ElasticError(f"{where}: expected a list of module names, got {value!r}")
    return tuple(value)


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
        raise ElasticError(f"pp {pp}: a pipeline layout needs `stages` (module prefix -> stage, e.g. Parallelism.stages(pp))")
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
