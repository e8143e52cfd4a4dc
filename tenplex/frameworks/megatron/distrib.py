"""Megatron's distributed optimizer on disk: `distrib_optim.pt` world buffers (docs/conventions.md §4.2).

Each model chunk has one buffer (all GPT parameters share a dtype). Its parameters are laid out
in reverse `named_parameters()` order, each starting at a multiple of 64 elements; a new bucket
starts once a bucket reaches `bucket_size` elements, and the tied embedding with PP > 1
(`shared_embedding`: the first stage's word embedding and the last stage's head copy) gets a
bucket of its own. Each bucket is one `tenplex.frontends.zero.bucket_layout`. DP rank 0 gathers
every DP shard and saves, per buffer, the concatenation of each bucket's first `numel_unpadded`
elements (bucket-end padding stripped, the 64-alignment gaps kept as zeros; a bucket closed
before a shared parameter ends at that parameter's 64-aligned start):

    {'buckets_coalesced': True,
     gbuf_idx: {dtype_key: {'param': fp32[n], 'exp_avg': fp32[n], 'exp_avg_sq': fp32[n], 'numel_unpadded': n}}}

`gbuf_idx` counts the chunks' buffers in chunk order; `dtype_key` is `(param_dtype, grad_dtype)`
in recent versions (kept as read). `bucket_size` is None (one bucket, besides the shared one)
without `overlap_grad_reduce`, on PP ranks > 0 and for virtual chunks > 0; otherwise
`args.ddp_bucket_size` or `max(4e7, 1e6·DP)`.

The frontend's PTC holds the same state as each DP rank's fragments (`stage_buffers`); the world
tensor is DP-independent, so reading slices it per parameter and cuts the fragments, and writing
assembles the fragments and places them.

Invariants (CheckpointFormatError naming file and key): the file has one buffer per chunk with
`numel_unpadded` equal to the layout's and tensors of that many float32 elements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.megatron.tensors import to_numpy, to_torch
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.frontends.layout import shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.optimizer import stage_buffers
from tenplex.frontends.params import Param
from tenplex.frontends.zero import PARAM_ALIGN, Bucket, bucket_layout

DISTRIB_KINDS = {"param": "fp32_param", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
Slots = dict[str, tuple[int, int]]  # label -> [start, stop) in the world tensor


def bucket_size(args: Any, dp: int, pp_rank: int, chunk: int) -> int | None:
    """Megatron DDP's bucket size for chunk `chunk` of PP rank `pp_rank` (None = unbounded)."""
    if not getattr(args, "overlap_grad_reduce", False) or pp_rank > 0 or chunk > 0:
        return None
    return getattr(args, "ddp_bucket_size", None) or max(40_000_000, 1_000_000 * dp)


def numel(model: ModelSpec, param: Param, tp: int) -> int:
    return math.prod(shard(param.shape, param.rule, tp, 0, model.make_vocab_size_divisible_by).shape)


def is_shared(model: ModelSpec, param: Param, pp_size: int) -> bool:
    """Megatron's `shared_embedding`: either copy of the tied embedding when PP > 1."""
    return model.tied_embeddings and pp_size > 1 and param.name == "embedding.word_embeddings.weight"


def buckets(params: Sequence[tuple[str, int, bool]], dp: int, size: int | None) -> list[Bucket]:
    """Megatron's buckets of one buffer from `(label, numel, shared)` in named_parameters() order.

    A bucket closed because the next parameter is shared keeps the 64-alignment of that
    parameter's start in its `numel_unpadded` (Megatron closes it at the padded start)."""
    out: list[Bucket] = []
    current: list[tuple[str, int]] = []
    pos = 0
    for label, n, shared in reversed(params):
        if shared and current:
            bucket = bucket_layout(current[::-1], dp)
            out.append(attrs.evolve(bucket, numel_unpadded=_align(pos)))
            current, pos = [], 0
        current.append((label, n))
        pos = _align(pos) + n
        if shared or (size is not None and pos >= size):
            out.append(bucket_layout(current[::-1], dp))
            current, pos = [], 0
    if current:
        out.append(bucket_layout(current[::-1], dp))
    return out


def _align(n: int) -> int:
    return -(-n // PARAM_ALIGN) * PARAM_ALIGN


def world_slots(layout: Sequence[Bucket]) -> tuple[Slots, int]:
    """Each parameter's range in the world tensor, and the tensor's length."""
    slots: Slots = {}
    offset = 0
    for b in layout:
        for s in b.slots:
            slots[s.key] = (offset + s.start, offset + s.stop)
        offset += b.numel_unpadded
    return slots, offset


def chunk_layout(model: ModelSpec, params: Sequence[Param], tp: int, pp_size: int, dp: int,
                 size: int | None) -> tuple[Slots, int]:  # fmt: skip
    """World slots of one chunk's buffer; `params` in named_parameters() order."""
    entries = [(p.label, numel(model, p, tp), is_shared(model, p, pp_size)) for p in params]
    return world_slots(buckets(entries, dp, size))


def read_buffers(value: Any, layouts: Sequence[tuple[Slots, int]], file: Path) -> tuple[dict[str, dict[str, np.ndarray]], Any]:
    """{label: {kind: flat TP-local array}} from a distrib_optim.pt object, and its dtype key.

    Raises:
        CheckpointFormatError: naming the file and the buffer key that is missing or mis-sized.
    """
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict) or not value.get("buckets_coalesced"):
        raise CheckpointFormatError(f"{file}: key 'buckets_coalesced' missing (only the coalesced format of 2024+ is supported)")
    extra = sorted(str(k) for k in value if k != "buckets_coalesced" and k not in range(len(layouts)))
    if extra:
        raise CheckpointFormatError(f"{file}: unknown key {extra[0]!r} (the layout has {len(layouts)} buffers)")
    out: dict[str, dict[str, np.ndarray]] = {}
    dtype_key = None
    for g, (slots, total) in enumerate(layouts):
        node = value.get(g)
        if not isinstance(node, dict) or len(node) != 1:
            raise CheckpointFormatError(f"{file}: key '{g}' missing or not one dtype entry (buffer of chunk {g})")
        dtype_key, tensors = next(iter(node.items()))
        where = f"{g}/{dtype_key}"
        if tensors.get("numel_unpadded") != total:
            raise CheckpointFormatError(f"{file}: key '{where}/numel_unpadded' is {tensors.get('numel_unpadded')}, "
                                        f"the layout has {total}")  # fmt: skip
        for key, kind in DISTRIB_KINDS.items():
            world = to_numpy(tensors.get(key), file, f"{where}/{key}") if key in tensors else None
            if world is None or world.shape != (total,) or world.dtype != np.float32:
                got = "missing" if world is None else f"{world.dtype}{list(world.shape)}"
                raise CheckpointFormatError(f"{file}: key '{where}/{key}' is {got}, expected float32[{total}]")
            for label, (start, stop) in slots.items():
                out.setdefault(label, {})[kind] = world[start:stop]
    return out, dtype_key


def write_buffers(layouts: Sequence[tuple[Slots, int]], flat: Mapping[str, Mapping[str, np.ndarray]], dtype_key: Any) -> dict:
    """The distrib_optim.pt object from {label: {kind: flat TP-local float32 array}}."""
    out: dict[Any, Any] = {"buckets_coalesced": True}
    for g, (slots, total) in enumerate(layouts):
        tensors: dict[str, Any] = {}
        for key, kind in DISTRIB_KINDS.items():
            world = np.zeros(total, dtype=np.float32)
            for label, (start, stop) in slots.items():
                world[start:stop] = flat[label][kind]
            tensors[key] = to_torch(world)
        tensors["numel_unpadded"] = total
        out[g] = {dtype_key: tensors}
    return out


def fragments(model: ModelSpec, stage: Sequence, tp: int, dp: int) -> dict[int, list[tuple[str, int, int]]]:
    """DP rank -> (label, start, stop) of the parameter fragments it owns in the frontend's PTC."""
    buffers = stage_buffers(model, stage, tp, dp, 1)
    return {d: [f for buf in buffers for f in buf.bucket.fragments(buf.shard_rank(d, 1))] for d in range(dp)}

