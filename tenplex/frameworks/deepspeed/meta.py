"""A DeepSpeed ZeRO-1/2 checkpoint as a PTC, and what it holds besides its tensors.

Tensors: `module/<key>` for each entry of the model file's `module` (16-bit or fp32 weights and
buffers, the file's dtype), and `<state>/<param>` (float32, the parameter's shape) for `fp32`
(the master weights) and each per-element optimizer state (`exp_avg`, `exp_avg_sq`, ...).

Partitions: `dp{r}` for each DP rank r, on device r of one host. `dp0` holds every `module/*`
tensor whole (DP rank 0 writes the model file); `dp{r}` holds, for each param group, its ZeRO
fragments (`layout.FlatGroup.fragments`) as 1-D sub-tensors `dp{r}/<state>/<param>` in flat
order (`layout.Fragment`; `tenplex.frontends.layout.flat_fragment` places them in the N-D
tensor). A universal checkpoint reads as the same PTC with one DP rank: whole tensors.

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
from tenplex.frontends.layout import Layout, flat_fragment
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

MASTER = "fp32"


@attrs.frozen(eq=False)
class DeepSpeedMeta:
    kind: str  # "zero" or "universal": what was read
    tag: str  # the tag directory's name
    dp: int  # the DP world size of the layout read
    groups: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]  # per param group: (name, shape), flat order
    module: tuple[tuple[str, str, tuple[int, ...]], ...]  # model file `module`: (key, dtype, shape), in order
    states: tuple[str, ...]  # per-element optimizer states besides fp32 (exp_avg, exp_avg_sq, ...)
    model_states: dict[str, Any]  # the model file without `module`
    optimizer: dict[str, Any]  # loss_scaler, dynamic_loss_scale, overflow, clip_grad, zero_stage, ds_version
    param_groups: tuple[dict[str, Any], ...]  # the inner optimizer's groups, without `params`
    scalars: tuple[dict[str, Any], ...]  # per group: the inner state's non-tensor entries (`step`)
    top: dict[str, Any]  # the optimizer files' ds_config and ds_version
    prefix: str = ""  # "bf16_" when the files were saved with bf16

    def flat_groups(self, dp: int) -> tuple[FlatGroup, ...]:
        return tuple(FlatGroup(tuple((n, math.prod(s)) for n, s in g), dp) for g in self.groups)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (MASTER, *self.states)

    @property
    def stage(self) -> int:
        return int(self.optimizer.get("zero_stage", 0))


def build_ptc(meta: DeepSpeedMeta, dp: int) -> PTC:
    """The PTC of `meta`'s checkpoint with `dp` DP ranks (see the module docstring)."""
    tensors = [TensorMeta(f"module/{k}", shape, dtype) for k, dtype, shape in meta.module]
    shapes = {n: s for g in meta.groups for n, s in g}
    tensors += [TensorMeta(f"{kind}/{n}", shapes[n], "float32") for kind in meta.kinds for n in shapes]
    subtensors, partitions = [], []
    for r in range(dp):
        ids = []
        if r == 0:
            for k, _, shape in meta.module:
                box = Box.from_shape(shape)
                subtensors.append(SubTensor(f"dp0/module/{k}", f"module/{k}", f"module/{k}", shape, (Piece(box, box),)))
                ids.append(subtensors[-1].id)
        for group in meta.flat_groups(dp):
            for f in group.fragments(r):
                whole = Box.from_shape(shapes[f.name])
                pieces = flat_fragment(Layout(shapes[f.name], (Piece(whole, whole),)), f.start, f.stop)
                for kind in meta.kinds:
                    sid = f"dp{r}/{kind}/{f.name}"
                    subtensors.append(SubTensor(sid, f"{kind}/{f.name}", f"{kind}/{f.name}", (f.stop - f.start,), pieces))
                    ids.append(sid)
        partitions.append(Partition(f"dp{r}", ids))
    return PTC(tuple(tensors), tuple(subtensors), tuple(partitions), Allocation({f"dp{r}": (r,) for r in range(dp)}),
               Topology(tuple(Device(r, "h0") for r in range(dp))))  # fmt: skip
