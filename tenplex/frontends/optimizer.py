"""Adam state as sub-tensors: per parameter (plain Megatron optimizer) or as flat-buffer
fragments (distributed optimizer, zero=1).

Tensors: `optim.fp32_param/<param>` (the fp32 master; absent when params are already float32),
`optim.exp_avg/<param>`, `optim.exp_avg_sq/<param>`, all float32 and of the parameter's global
shape. A state tensor is sharded exactly like its parameter (vocab padding included).

Keys (sub-tensor `path`, `label` = the parameter's label):
- zero=0: `optimizer/fp32_from_fp16_params/<label>`, `optimizer/state/<label>/exp_avg|exp_avg_sq`;
- zero=1: `distrib_optim/param|exp_avg|exp_avg_sq/<label>`: the DP rank's fragment of the
  parameter, a 1-D array in flat-buffer order. `stage_buffers` gives the buffer layout that
  places the fragments in Megatron's buffers.

Buffers (zero=1), per pipeline chunk: the dense parameters (one bucket, sharded over all DP
ranks), the tied head copy in a bucket of its own (Megatron's `shared_embedding`), and the
expert parameters of one EP rank (sharded over the DP/EP ranks of its expert-DP group).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import attrs

from tenplex.frontends.layout import Layout, flat_fragment, shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.params import Param
from tenplex.frontends.pipeline import Chunk
from tenplex.frontends.zero import Bucket, bucket_layout
from tenplex.ir.tensor import SubTensor

KINDS = ("fp32_param", "exp_avg", "exp_avg_sq")
_LEGACY_PATH = {
    "fp32_param": "optimizer/fp32_from_fp16_params/{}",
    "exp_avg": "optimizer/state/{}/exp_avg",
    "exp_avg_sq": "optimizer/state/{}/exp_avg_sq",
}
_DISTRIB_KEY = {"fp32_param": "param", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


def optim_kinds(model: ModelSpec) -> tuple[str, ...]:
    """The Adam state tensors kept per parameter (none without an optimizer)."""
    if not model.has_optimizer:
        return ()
    return KINDS if model.dtype != "float32" else KINDS[1:]


def optim_tensor(kind: str, name: str) -> str:
    return f"optim.{kind}/{name}"


def optim_subtensors(model: ModelSpec, pid: str, param: Param, layout: Layout) -> list[SubTensor]:
    """Adam state of one parameter laid out like the parameter (zero=0)."""
    return [
        SubTensor(
            f"{pid}/{optim_tensor(kind, param.label)}",
            optim_tensor(kind, param.name),
            _LEGACY_PATH[kind].format(param.label),
            layout.shape,
            layout.pieces,
        )
        for kind in optim_kinds(model)
    ]


@attrs.frozen
class Buffer:
    """One distributed-optimizer buffer of a chunk: `group` is dense, shared or expert."""

    chunk: Chunk
    group: str
    params: tuple[Param, ...]
    bucket: Bucket

    def shard_rank(self, dp_rank: int, ep: int) -> int:
        """The shard of this buffer that DP rank `dp_rank` owns."""
        return dp_rank // ep if self.group == "expert" else dp_rank


def stage_buffers(
    model: ModelSpec, stage: Sequence[tuple[Chunk, Sequence[Param]]], tp: int, dp: int, ep: int
) -> list[Buffer]:
    """Buffers of one pipeline stage (for one EP rank), chunk by chunk."""
    out = []
    for chunk, params in stage:
        groups = {
            "dense": [p for p in params if not p.expert and not p.shared],
            "shared": [p for p in params if p.shared],
            "expert": [p for p in params if p.expert],
        }
        for group, members in groups.items():
            if members:
                numels = [
                    (p.label, math.prod(shard(p.shape, p.rule, tp, 0, model.make_vocab_size_divisible_by).shape))
                    for p in members
                ]
                shards = dp // ep if group == "expert" else dp
                out.append(Buffer(chunk, group, tuple(members), bucket_layout(numels, shards)))
    return out


def fragment_subtensors(
    model: ModelSpec, pid: str, buffers: Sequence[Buffer], tp: int, tp_rank: int, dp_rank: int, ep: int
) -> Iterator[SubTensor]:
    """The fragments of every parameter that DP rank `dp_rank` owns, for TP rank `tp_rank`."""
    for buf in buffers:
        by_label = {p.label: p for p in buf.params}
        for label, start, stop in buf.bucket.fragments(buf.shard_rank(dp_rank, ep)):
            param = by_label[label]
            layout = shard(param.shape, param.rule, tp, tp_rank, model.make_vocab_size_divisible_by)
            pieces = flat_fragment(layout, start, stop)
            for kind in optim_kinds(model):
                yield SubTensor(
                    f"{pid}/{optim_tensor(kind, label)}",
                    optim_tensor(kind, param.name),
                    f"distrib_optim/{_DISTRIB_KEY[kind]}/{label}",
                    (stop - start,),
                    pieces,
                )
