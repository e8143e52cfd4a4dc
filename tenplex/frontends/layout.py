"""The one function that turns a tensor-parallel sharding rule into boxes, and ZeRO flat fragments.

`shard(shape, rule, tp, rank)` gives what TP rank `rank` of `tp` holds of a parameter of
global `shape` (t = tp, r = rank):

- `replicated`: the whole tensor.
- `column`: dim-0 rows [r·n/t, (r+1)·n/t).
- `row`: dim-1 columns [r·n/t, (r+1)·n/t) (row-parallel linear weights).
- `qkv`: the fused QKV weight/bias in Megatron's grouped layout `[(np+2ng)·hn, ...]`; split into
  contiguous dim-0 chunks (whole query groups when t divides ng, group fragments otherwise).
- `vocab`: the global tensor has the true vocab V rows; it is padded to
  `Vp = ceil(V / (m·t))·m·t` and rank r holds padded rows [r·Vp/t, (r+1)·Vp/t); rows >= V are
  fill (no piece).
- `glu`: the gated fc1 `[W; V]` with 2f rows; rank r holds `[W_r; V_r]` as two pieces:
  global rows [r·f/t, (r+1)·f/t) at local [0, f/t) and [f + r·f/t, f + (r+1)·f/t) at
  local [f/t, 2f/t).

`flat_fragment(layout, start, stop)` gives the 1-D pieces of the flat range [start, stop) of
a TP-local array's row-major flattening (a ZeRO / distributed-optimizer fragment).

Invariants:
- the split extent divides by t (vocab: after padding), else SpecError quoting shape and t;
- the t ranks' pieces tile the tensor exactly (replicated: every rank holds it all);
- every piece's local box spans the full local extent of dims >= 1 (a dim-0 slab), which is
  what makes a slab's part of a row-major run itself a run; flat_fragment checks it.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence

import attrs

from tenplex.ir.box import Box, row_major_boxes
from tenplex.ir.errors import IRError, SpecError
from tenplex.ir.tensor import Piece


class Rule(enum.Enum):
    REPLICATED = "replicated"
    COLUMN = "column"
    ROW = "row"
    QKV = "qkv"
    VOCAB = "vocab"
    GLU = "glu"


@attrs.frozen
class Layout:
    """A TP-local array: its shape and the pieces of the global tensor it holds."""

    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron's Vp = ceil(V / (m·t))·m·t."""
    step = multiple * tp
    return -(-vocab // step) * step


def _rows(start: int, stop: int, shape: tuple[int, ...], dim: int = 0) -> Box:
    lo, hi = [0] * len(shape), list(shape)
    lo[dim], hi[dim] = start, stop
    return Box(lo, hi)


def _split(shape: tuple[int, ...], dim: int, tp: int, rank: int, rule: Rule) -> Layout:
    if len(shape) <= dim:
        raise SpecError(f"{rule.value} rule splits dim {dim}, but shape {list(shape)} has {len(shape)} dims")
    if shape[dim] % tp:
        raise SpecError(f"{rule.value} rule: dim {dim} of shape {list(shape)} is not divisible by tp={tp}")
    n = shape[dim] // tp
    local = shape[:dim] + (n,) + shape[dim + 1 :]
    return Layout(local, (Piece(_rows(rank * n, (rank + 1) * n, shape, dim), Box.from_shape(local)),))


def _vocab(shape: tuple[int, ...], tp: int, rank: int, multiple: int) -> Layout:
    if not shape:
        raise SpecError("vocab rule needs a tensor with a vocabulary dim 0, got a scalar")
    vocab = shape[0]
    n = padded_vocab(vocab, tp, multiple) // tp
    local = (n,) + shape[1:]
    start, stop = rank * n, min((rank + 1) * n, vocab)
    pieces = (Piece(_rows(start, stop, shape), _rows(0, stop - start, local)),) if start < stop else ()
    return Layout(local, pieces)


def _glu(shape: tuple[int, ...], tp: int, rank: int) -> Layout:
    if not shape or shape[0] % (2 * tp):
        raise SpecError(f"glu rule: dim 0 of shape {list(shape)} must be 2·f with f divisible by tp={tp}")
    f, n = shape[0] // 2, shape[0] // (2 * tp)
    local = (2 * n,) + shape[1:]
    gate = Piece(_rows(rank * n, (rank + 1) * n, shape), _rows(0, n, local))
    up = Piece(_rows(f + rank * n, f + (rank + 1) * n, shape), _rows(n, 2 * n, local))
    return Layout(local, (gate, up))


def shard(shape: Sequence[int], rule: Rule, tp: int, rank: int, vocab_multiple: int = 128) -> Layout:
    """What TP rank `rank` of `tp` holds of a tensor of global `shape` under `rule`.

    Raises:
        SpecError: the split extent does not divide by tp, or the rule does not fit the shape.
    """
    return _shard(tuple(shape), rule, tp, rank, vocab_multiple)


@functools.lru_cache(maxsize=4096)
def _shard(shape: tuple[int, ...], rule: Rule, tp: int, rank: int, vocab_multiple: int) -> Layout:
    if not 0 <= rank < tp:
        raise SpecError(f"tp rank {rank} is outside [0, {tp})")
    if rule is Rule.REPLICATED:
        return Layout(shape, (Piece(Box.from_shape(shape), Box.from_shape(shape)),))
    if rule is Rule.VOCAB:
        return _vocab(shape, tp, rank, vocab_multiple)
    if rule is Rule.GLU:
        return _glu(shape, tp, rank)
    return _split(shape, 1 if rule is Rule.ROW else 0, tp, rank, rule)


def _check_slab(layout: Layout, piece: Piece) -> None:
    box = piece.local_box
    if box.start[1:] != (0,) * (len(layout.shape) - 1) or box.stop[1:] != layout.shape[1:]:
        raise IRError(
            f"piece local box {box} is not a dim-0 slab of local shape {layout.shape}; cannot cut flat fragments"
        )


def flat_fragment(layout: Layout, start: int, stop: int) -> tuple[Piece, ...]:
    """1-D pieces of the flat range [start, stop) of `layout`'s row-major flattening.

    A returned piece's local box is in fragment coordinates ([0, stop - start)); flat positions
    that fall in fill (no piece) stay uncovered. Raises IRError on a non-slab piece.
    """
    out: list[Piece] = []
    offset = 0
    for run in row_major_boxes(layout.shape, start, stop):
        row = run.volume // run.shape[0] if run.ndim else 1
        for piece in layout.pieces:
            _check_slab(layout, piece)
            part = run.intersect(piece.local_box) if run.ndim else run
            if part is None:
                continue
            at = offset + (part.start[0] - run.start[0]) * row if run.ndim else offset
            out.append(Piece(piece.to_global(part), Box((at,), (at + part.volume,))))
        offset += run.volume
    return tuple(out)
