"""How megatron-core cuts a `torch_dist` checkpoint of a tp x pp x dp job into saved chunks.

The keys are global: they do not change with TP or PP (conventions §1.5). A layout changes only
how each tensor is cut into saved chunks and which rank's data file holds each chunk. Megatron's
cut (`sharded_state_dict` of the mcore layers), which `dst_ptc` reproduces for the target:

- a layer stack (`decoder.layers.<name>`, no layer index) has a leading axis of size L, cut into
  one chunk per layer; a non-homogeneous stack keeps `decoder.layers.<i>.<name>` keys;
- a tensor-parallel parameter is cut along its TP axis (`tp_axis`: axis 0 of column-parallel and
  vocabulary tensors, axis 1 of row-parallel weights) into tp chunks, or 2·tp for a SwiGLU
  `linear_fc1` (W_r at chunk r, V_r at chunk r + tp, §2.3): the source's count over its tp is
  the factor kept;
- every other axis keeps the source's cut (the layer axis; the flat bucket buffers of the
  distributed optimizer's `dp_reshardable` form, whose keys name a TP x PP group and whose
  cuts are parameter and DP-shard boundaries).

Optimizer state follows its parameter (`optimizer.state.<exp_avg|exp_avg_sq|fp32_param|param>.<key>`).
A chunk goes to a rank that holds it in the target job: its TP rank (chunk index mod tp), the PP
stage of its layer (`embedding.*` on the first stage, `output_layer` and `final_layernorm` on the
last), and, among the DP replicas, the one with the fewest bytes so far (as megatron-core's fully
parallel save spreads replicas over the DP group). Rank order is megatron-core's: tp fastest, then
dp, then pp.

Invariants: the target chunks of a tensor tile it exactly (a regular grid); a dimension cut into
tp parts divides evenly, except a vocabulary dimension (Megatron pads the vocabulary per TP and
loads it with `allow_shape_mismatch`, so the last part may be shorter).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

import attrs

from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor, itemsize
from tenplex.ir.topology import Device, Topology

OPTIMIZER = re.compile(r"optimizer\.state\.[a-z_0-9]+\.")
COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias",
          "word_embeddings.weight", "output_layer.weight", "output_layer.bias")  # fmt: skip
ROW = ("linear_proj.weight", "linear_fc2.weight")
VOCAB = ("word_embeddings.weight", "output_layer.weight", "output_layer.bias")
LAST_STAGE = ("output_layer.", "decoder.final_layernorm.", "decoder.final_norm.")
_INDEXED = re.compile(r"decoder\.layers\.(\d+)\.")


@attrs.frozen
class Layout:
    """A Megatron job's tp x pp x dp; rank (t, p, d) is t + tp·(d + dp·p)."""

    tp: int = attrs.field(validator=attrs.validators.ge(1))
    pp: int = attrs.field(validator=attrs.validators.ge(1))
    dp: int = attrs.field(validator=attrs.validators.ge(1))

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, t: int, p: int, d: int) -> int:
        return t + self.tp * (d + self.dp * p)

    def __str__(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}"


def model_key(key: str) -> str:
    """The parameter key of a tensor key (optimizer state keys name their parameter)."""
    m = OPTIMIZER.match(key)
    return key[m.end():] if m else key


def tp_axis(key: str, ndim: int) -> int | None:
    """The global axis along which tensor `key` (of `ndim` dims) is tensor-parallel, or None."""
    name = model_key(key)
    base = 1 if name.endswith(".bias") else 2
    for suffixes, axis in ((COLUMN, 0), (ROW, 1)):
        if name.endswith(suffixes) and ndim >= base:
            return ndim - base + axis
    return None


def grid(name: str, shape: Sequence[int], boxes: Sequence[Box]) -> list[list[int]]:
    """Per axis, the cut points (0, ..., size) of a tensor's chunks. Raises CheckpointFormatError
    when the chunks are not a regular grid (megatron-core saves only grids)."""
    cuts = [sorted({b.start[a] for b in boxes} | {shape[a]}) for a in range(len(shape))]
    if any(s == 0 for s in shape):
        return [[0, s] for s in shape]
    if len(boxes) != _cells(cuts) or {b for b in boxes} != set(_boxes(cuts)):
        raise CheckpointFormatError(f"tensor {name!r}: its {len(boxes)} saved chunks are not a regular grid; "
                                    "megatron-core saves a grid of equal chunks")  # fmt: skip
    return cuts


def _cells(cuts: list[list[int]]) -> int:
    n = 1
    for c in cuts:
        n *= len(c) - 1
    return n


def _boxes(cuts: list[list[int]]) -> list[Box]:
    spans = [list(zip(c, c[1:])) for c in cuts]
    return [Box([a for a, _ in cell], [b for _, b in cell]) for cell in itertools.product(*spans)]


def dst_cuts(name: str, shape: Sequence[int], cuts: list[list[int]], src: Layout, dst: Layout) -> list[list[int]]:
    """The target grid: the source's, with the TP axis recut for `dst.tp` (see the module docstring).

    Raises CheckpointFormatError when the source's TP cut is not a multiple of its tp, or the
    target's does not divide a non-vocabulary dimension."""
    axis = tp_axis(name, len(shape))
    if axis is None or src.tp == dst.tp:
        return cuts
    parts = len(cuts[axis]) - 1
    if parts % src.tp:
        raise CheckpointFormatError(f"tensor {name!r}: cut into {parts} parts along its tensor-parallel axis {axis}, "
                                    f"not a multiple of the checkpoint's tp={src.tp}")  # fmt: skip
    n, size = parts // src.tp * dst.tp, shape[axis]
    if size % n and not model_key(name).endswith(VOCAB):
        raise CheckpointFormatError(f"tensor {name!r}: dimension {axis} of size {size} does not split into {n} "
                                    f"equal parts for tp={dst.tp}")  # fmt: skip
    step = -(-size // n)
    return [*cuts[:axis], sorted({min(i * step, size) for i in range(n)} | {size}), *cuts[axis + 1:]]


def num_layers(ptc: PTC) -> int:
    """The number of transformer layers: a layer stack's leading size, or the highest layer index + 1."""
    stacks = [t.shape[0] for t in ptc.tensors if model_key(t.name).startswith("decoder.layers.") and t.shape
              and not _INDEXED.match(model_key(t.name))]  # fmt: skip
    indexed = [int(m[1]) + 1 for t in ptc.tensors if (m := _INDEXED.match(model_key(t.name)))]
    return max([1, *stacks, *indexed])


def stage(name: str, box: Box, shape: Sequence[int], pp: int, layers: int) -> int:
    """The PP stage that holds chunk `box` of tensor `name` in a model of `layers` layers."""
    key = model_key(name)
    m = _INDEXED.match(key)
    if m:
        return int(m[1]) * pp // layers
    if key.startswith("decoder.layers.") and shape:
        return box.start[0] * pp // shape[0]
    return pp - 1 if key.startswith(LAST_STAGE) else 0


def dst_ptc(src: PTC, src_layout: Layout, dst_layout: Layout, values: Mapping[str, Value]) -> PTC:
    """The target checkpoint as a PTC: partition `rank<r>` per target rank (so `write_dcp`
    writes `__<r>_0.distcp`), one sub-tensor per target chunk; `values` (the sharded objects)
    go to rank 0. Raises CheckpointFormatError as `grid` and `dst_cuts` do."""
    layers = num_layers(src)
    load = [0] * dst_layout.world
    held: dict[int, list[SubTensor]] = {r: [] for r in range(dst_layout.world)}
    for meta in src.tensors:
        boxes = [p.global_box for st in src.by_tensor[meta.name] for p in st.pieces]
        cuts = dst_cuts(meta.name, meta.shape, grid(meta.name, meta.shape, boxes), src_layout, dst_layout)
        axis = tp_axis(meta.name, len(meta.shape))
        for box in _boxes(cuts):
            tp_rank = None if axis is None else cuts[axis].index(box.start[axis]) % dst_layout.tp
            ranks = holders(dst_layout, tp_rank, stage(meta.name, box, meta.shape, dst_layout.pp, layers))
            r = min(ranks, key=lambda r: (load[r], r))
            load[r] += box.volume * itemsize(meta.dtype)
            pieces = (Piece(box, Box.from_shape(box.shape)),) if box.volume else ()
            sid = f"{meta.name}@[{','.join(map(str, box.start))}]"
            held[r].append(SubTensor(sid, meta.name, sid, box.shape, pieces))
    subtensors = tuple(st for r in range(dst_layout.world) for st in held[r])
    partitions = tuple(Partition(f"rank{r}", [st.id for st in held[r]], values if r == 0 else {})
                       for r in range(dst_layout.world))  # fmt: skip
    return PTC(src.tensors, subtensors, partitions, Allocation({f"rank{r}": (r,) for r in range(dst_layout.world)}),
               Topology(tuple(Device(r, "h0") for r in range(dst_layout.world))))  # fmt: skip


def holders(layout: Layout, tp_rank: int | None, pp_rank: int) -> list[int]:
    """The ranks of stage `pp_rank` with TP rank `tp_rank` (any, for None), over every DP rank."""
    tps = range(layout.tp) if tp_rank is None else [tp_rank]
    return [layout.rank(t, pp_rank, d) for d in range(layout.dp) for t in tps]
