"""Megatron distributed-optimizer (ZeRO-1) flat buffers: where each parameter lands and which
DP rank owns which fragment (docs/conventions.md §4.2.1).

A bucket lays its parameters out in **reverse** `named_parameters()` order (backprop order);
each parameter starts at a multiple of 64 elements; the bucket end is padded to a multiple of
lcm(DP, 128); the bucket is cut into DP equal contiguous shards and DP rank r owns shard r.
Elements are TP-local: a parameter occupies the numel of its TP-local array (vocab padding rows
included). The frontend keeps one bucket per buffer, as with `overlap_grad_reduce` off.

Worked example: A [10,4], B [4,4], C [4], DP 2 -> C at [0,4), B at [64,80), A at [128,168);
size 256; shards [0,128) (C, B) and [128,256) (A).

Invariants: slots are disjoint, in reverse input order, 64-aligned; numel >= numel_unpadded
and divides by lcm(shards, 128).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import attrs

from tenplex.ir.errors import SpecError

PARAM_ALIGN = 64
BUCKET_ALIGN = 128


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@attrs.frozen
class Slot:
    """Parameter `key` at flat range [start, stop) of its bucket."""

    key: str
    start: int
    stop: int


@attrs.frozen
class Bucket:
    slots: tuple[Slot, ...]
    numel_unpadded: int
    numel: int
    shards: int

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Flat range of the bucket that DP rank `rank` owns."""
        size = self.numel // self.shards
        return rank * size, (rank + 1) * size

    def fragments(self, rank: int) -> Iterator[tuple[str, int, int]]:
        """(key, start, stop) of each parameter's part owned by `rank`, relative to the parameter."""
        lo, hi = self.shard_range(rank)
        for slot in self.slots:
            a, b = max(lo, slot.start), min(hi, slot.stop)
            if a < b:
                yield slot.key, a - slot.start, b - slot.start


def bucket_layout(params: Sequence[tuple[str, int]], shards: int) -> Bucket:
    """Lay out `(key, numel)` pairs, given in `named_parameters()` order, for `shards` DP ranks.

    Raises:
        SpecError: shards < 1.
    """
    if shards < 1:
        raise SpecError(f"a flat buffer needs >= 1 DP shard, got {shards}")
    slots, pos = [], 0
    for key, numel in reversed(params):
        start = _round_up(pos, PARAM_ALIGN)
        slots.append(Slot(key, start, start + numel))
        pos = start + numel
    numel = _round_up(pos, math.lcm(shards, BUCKET_ALIGN))
    return Bucket(tuple(slots), pos, numel, shards)
