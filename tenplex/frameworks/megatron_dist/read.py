"""Read a Megatron `torch_dist` checkpoint: its DCP state as a PTC triple, plus what Megatron keeps
beside it (`common.pt`, `metadata.json`) and the tp x pp x dp layout it was saved under.

The layout comes from `common.pt`'s `args` (`tensor_model_parallel_size`,
`pipeline_model_parallel_size`, `data_parallel_size`), as Megatron-LM's loader takes it. A
checkpoint saved without `args` (megatron-core's `dist_checkpointing.save` called directly)
says nothing about PP and DP; tp is then read off the cut of `linear_qkv.weight` and pp = dp = 1,
and `origin` says so.

The optimizer form is told by the keys: `optimizer.state.*` (the non-distributed optimizer, or
the distributed one saved `fully_reshardable`: model space, cut like the parameter) or
`optimizer.distributed.*` (`dp_reshardable`: flat bucket buffers of one TP x PP group).

Raises `CheckpointFormatError` (files.py) for a missing or half-written directory, and the DCP
reader's `DcpError` for its data.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.dcp.read import read_dcp, read_index
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.frameworks.megatron_dist.files import DistDir, check_complete, locate, read_common, read_config
from tenplex.frameworks.megatron_dist.layout import Layout, grid, tp_axis
from tenplex.ir.ptc import PTC

DP_RESHARDABLE = "optimizer.distributed."
MODEL_SPACE = "optimizer.state."


@attrs.frozen
class DistCheckpoint:
    """A read `torch_dist` checkpoint: where it is, its side files, layout and PTC triple."""

    where: DistDir
    config: dict[str, Any]
    common: dict[str, Any]
    layout: Layout
    origin: str
    ptc: PTC
    arrays: dict[str, np.ndarray] = attrs.field(eq=False)
    values: dict[str, dict[str, Any]] = attrs.field(eq=False)

    @property
    def optimizer(self) -> str | None:
        """`dp_reshardable`, `model space` (non-distributed or `fully_reshardable`), or None."""
        names = [t.name for t in self.ptc.tensors]
        if any(n.startswith(DP_RESHARDABLE) for n in names):
            return "dp_reshardable"
        return "model space" if any(n.startswith(MODEL_SPACE) for n in names) else None


def read_megatron_dist(path: str | os.PathLike, *, trust_pickles: bool = False) -> DistCheckpoint:
    """The checkpoint at `path` (a Megatron-LM tree or a bare dist_checkpointing directory),
    its arrays memory-mapped (`read_dcp`)."""
    where = locate(path)
    check_complete(where.step)
    config = read_config(where.step)
    common = read_common(where.step, trust_pickles=trust_pickles)
    index = read_index(where.step, trust_pickles=trust_pickles)
    ptc, arrays, values = read_dcp(where.step, index)
    layout, origin = source_layout(common, ptc)
    return DistCheckpoint(where, config, common, layout, origin, ptc, arrays, values)


def source_layout(common: dict[str, Any], ptc: PTC) -> tuple[Layout, str]:
    """(layout, where it was read from) of a checkpoint (see the module docstring)."""
    args = common.get("args")
    sizes = [getattr(args, f"{k}_parallel_size", None) for k in ("tensor_model", "pipeline_model", "data")]
    if all(type(s) is int and s >= 1 for s in sizes[:2]):
        dp = sizes[2] if type(sizes[2]) is int and sizes[2] >= 1 else 1
        return Layout(sizes[0], sizes[1], dp), "common.pt args"
    for meta in ptc.tensors:
        axis = tp_axis(meta.name, len(meta.shape))
        if meta.name.endswith("linear_qkv.weight") and axis is not None:
            cuts = grid(meta.name, meta.shape, [p.global_box for st in ptc.by_tensor[meta.name] for p in st.pieces])
            return Layout(len(cuts[axis]) - 1, 1, 1), "the cut of linear_qkv.weight (no args in common.pt: pp and dp taken as 1)"
    raise CheckpointFormatError("common.pt has no args and no linear_qkv.weight tells the tensor-parallel size")
