"""A DeepSpeed ZeRO-1/2 checkpoint as a PTC, and what it holds besides its tensors.

Tensors: `module/<key>` for each entry of the model file's `module` (16-bit or fp32 weights and
buffers, the file's dtype), and `<state>/<param>` (float32, the parameter's shape) for `fp32`
(the master weights) and each per-element optimizer state (`exp_avg`, `exp_avg_sq`, ...).

Partitions: `dp{r}` for each DP rank r, on device r of one host. `dp0` holds every `module/*`
tensor whole (DP rank 0 writes the model file); `dp{r}` holds, for each param group, its ZeRO
fragments (`layout.FlatGroup.fragments`) as 1-D sub-tensors `dp{r}/<state>/<param>` in flat
order (`layout.Fragment`; `tenplex.frontends.layout.flat_fragment` places them in the N-D
tensor). A universal checkpoint reads as the same PTC with one DP rank: whole tensors.

Tensor parallelism (`tp` > 1, `mp_rank_XX` files): partition `mp{m}dp{r}` (device r·tp + m,
Megatron's order) holds model-parallel rank m's local tensors, each placed in the global tensor
by its split dim (`meta.split`, from `tp.splits`: `Rule.COLUMN`, `Rule.ROW` or replicated, where
every TP rank holds the whole tensor). A parameter whose split is unknown is one tensor per TP
rank (`mp{m}/<state>/<param>`): the DP world size can change, TP cannot.

Pipelines (`layer_*` files, `pipe.py`): partition `mp{s}dp{r}` is stage s, DP rank r; the module
entries `{layer}.{key}` of the stage's layers are held by `mp{s}dp0`, the ZeRO fragments of the
stage's param groups (`DeepSpeedMeta.groups_of`) by each `mp{s}dp{r}`; tensors are global.

`DeepSpeedMeta` carries what the writer needs that the PTC does not say: the param groups (names
and shapes in flat order), the model file without `module`, the optimizer's non-tensor state
(loss scaler, clip_grad, param groups' hyper-parameters, the per-group `step`), and the files'
`ds_config`/`ds_version`.

Invariants: the PTC of `(meta, dp)` is a pure function of both; the partitions' 1-D sub-tensors
of one state tensor are disjoint and cover it (fp32 and each state alike).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from tenplex.frameworks.deepspeed.layout import FlatGroup
from tenplex.frameworks.deepspeed.pipe import layer_of
from tenplex.frameworks.deepspeed.tp import UNKNOWN, local_shape
from tenplex.frontends.layout import Layout, Rule, flat_fragment, shard
from tenplex.ir.ptc import PTC, Allocation, Partition
from tenplex.ir.tensor import SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

MASTER = "fp32"


@attrs.frozen(eq=False)
class DeepSpeedMeta:
    kind: str  # "zero" or "universal": what was read
    tag: str  # the tag directory's name
    dp: int  # the DP world size of the layout read
    groups: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]  # per param group: (name, global shape), flat order
    module: tuple[tuple[str, str, tuple[int, ...]], ...]  # model file `module`: (key, dtype, global shape), in order
    states: tuple[str, ...]  # per-element optimizer states besides fp32 (exp_avg, exp_avg_sq, ...)
    model_states: dict[str, Any]  # the model file without `module` (of model-parallel rank 0)
    optimizer: dict[str, Any]  # loss_scaler, dynamic_loss_scale, overflow, clip_grad, zero_stage, ds_version
    param_groups: tuple[dict[str, Any], ...]  # the inner optimizer's groups, without `params`
    scalars: tuple[dict[str, Any], ...]  # per group: the inner state's non-tensor entries (`step`)
    top: dict[str, Any]  # the optimizer files' ds_config and ds_version
    prefix: str = ""  # "bf16_" when the files were saved with bf16
    tp: int = 1  # the model-parallel (TP) world size read
    split: dict[str, int | None] = attrs.field(factory=dict)  # module key -> split dim (None: replicated; tp.UNKNOWN)
    why_fixed: str = ""  # why TP cannot change ("" when it can), see tp.splits
    other_states: tuple[dict[str, Any], ...] = ()  # the model files of model-parallel ranks 1.. without `module`
    layers: tuple[tuple[int, tuple[str, ...]], ...] = ()  # a pipeline's layer files: (index, state keys)
    parts: tuple[int, ...] = ()  # a pipeline's stage boundaries: stage s holds layers [parts[s], parts[s+1])
    pp_methods: tuple[str, ...] = ()  # the partition methods that reproduce `parts` (pipe.methods)

    @property
    def pp(self) -> int:
        return max(1, len(self.parts) - 1)

    def local(self, name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
        return local_shape(shape, self.split.get(name, UNKNOWN), tp)

    def groups_of(self, m: int, parts: tuple[int, ...] | None = None) -> tuple:
        """Model-parallel rank m's param groups: all of them, or a pipeline stage's layers'."""
        if not self.layers:
            return self.groups
        lo, hi = (parts or self.parts)[m], (parts or self.parts)[m + 1]
        return tuple(tuple((n, s) for n, s in g if lo <= layer_of(n) < hi) for g in self.groups)

    def flat_groups(self, dp: int, tp: int | None = None, m: int = 0, parts: tuple[int, ...] | None = None) -> tuple[FlatGroup, ...]:
        tp = self.tp if tp is None else tp
        return tuple(FlatGroup(tuple((n, math.prod(self.local(n, s, tp))) for n, s in g), dp) for g in self.groups_of(m, parts))

    def holds(self, key: str, m: int, parts: tuple[int, ...] | None = None) -> bool:
        """Whether model-parallel rank m's model files hold module entry `key`."""
        return not self.layers or (parts or self.parts)[m] <= layer_of(key) < (parts or self.parts)[m + 1]

    def ranks(self, tp: int, parts: tuple[int, ...] | None) -> int:
        """Model-parallel ranks: TP ranks, or the stages of a pipeline."""
        return len(parts or self.parts) - 1 if self.layers else tp

    @property
    def kinds(self) -> tuple[str, ...]:
        return (MASTER, *self.states)

    @property
    def stage(self) -> int:
        return int(self.optimizer.get("zero_stage", 0))


def pid(m: int, r: int, tp: int) -> str:
    """The partition of model-parallel rank m, DP rank r (`dp{r}` with one model-parallel rank)."""
    return f"dp{r}" if tp == 1 else f"mp{m}dp{r}"


def tensor_name(meta: DeepSpeedMeta, kind: str, name: str, m: int, tp: int) -> str:
    """A parameter's tensor; one per model-parallel rank when its split is unknown."""
    return f"mp{m}/{kind}/{name}" if tp > 1 and meta.split.get(name, UNKNOWN) == UNKNOWN else f"{kind}/{name}"


def _layout(meta: DeepSpeedMeta, name: str, shape: tuple[int, ...], m: int, tp: int) -> Layout:
    dim = meta.split.get(name, UNKNOWN)
    if dim is None or dim == UNKNOWN:
        return shard(shape, Rule.REPLICATED, 1, 0)
    return shard(shape, Rule.ROW if dim == 1 else Rule.COLUMN, tp, m)


def build_ptc(meta: DeepSpeedMeta, dp: int, tp: int | None = None, parts: tuple[int, ...] | None = None) -> PTC:
    """The PTC of `meta`'s checkpoint with `tp` (or, for a pipeline, `len(parts) - 1` stages) x
    `dp` ranks (see the module docstring)."""
    tp = meta.tp if tp is None else tp
    n = meta.ranks(tp, parts)
    shapes = {name: s for g in meta.groups for name, s in g}
    tensors: dict[str, TensorMeta] = {}
    subtensors, partitions = [], []
    for m in range(n):
        for r in range(dp):
            ids = []
            if r == 0:
                for k, dtype, shape in meta.module:
                    if meta.holds(k, m, parts):
                        ids.append(_sub(meta, subtensors, tensors, "module", k, shape, dtype, m, tp, pid(m, 0, n), None))
            for group in meta.flat_groups(dp, tp, m, parts):
                for f in group.fragments(r):
                    for kind in meta.kinds:
                        ids.append(_sub(meta, subtensors, tensors, kind, f.name, shapes[f.name], "float32", m, tp, pid(m, r, n), f))
            partitions.append(Partition(pid(m, r, n), ids))
    alloc = {pid(m, r, n): (r * n + m,) for m in range(n) for r in range(dp)}
    return PTC(tuple(tensors.values()), tuple(subtensors), tuple(partitions), Allocation(alloc),
               Topology(tuple(Device(i, "h0") for i in range(n * dp))))  # fmt: skip


def _sub(meta: DeepSpeedMeta, out: list, tensors: dict, kind: str, name: str, shape: tuple[int, ...], dtype: str, m: int,
         tp: int, part: str, frag: Any) -> str:  # fmt: skip
    """Append the sub-tensor of `kind`/`name` (a whole local tensor, or ZeRO fragment `frag`)."""
    tname = tensor_name(meta, kind, name, m, tp)
    layout = _layout(meta, name, shape, m, tp)
    tensors.setdefault(tname, TensorMeta(tname, shape, dtype))
    sid = f"{part}/{kind}/{name}"
    if frag is None:
        out.append(SubTensor(sid, tname, tname, layout.shape, layout.pieces))
    else:
        out.append(SubTensor(sid, tname, tname, (frag.stop - frag.start,), flat_fragment(layout, frag.start, frag.stop)))
    return sid
