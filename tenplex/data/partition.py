"""Splitting global batches over W data-parallel ranks: what rank r reads at each step.

Policy (balanced contiguous): a global batch B of n samples is cut into W contiguous slices in
rank order. With q, m = divmod(n, W), rank r gets `count_r = q + (r < m)` samples starting at
`r*q + min(r, m)`, so the rank-major concatenation of the slices is B itself, in order.
- W must divide G (each rank then reads G/W samples of every full batch). `uneven=True` allows
  any W: counts then differ by at most 1, and a trainer must normalise the loss by
  `RankStep.global_count` (the sum of per-sample losses over all ranks / len(B)).
- The short last batch of an epoch under tail policy "partial" is split the same way, so
  counts may differ there, and ranks past n get 0 samples; `count` and `global_count` say so.
- Gradient accumulation keeps G constant for any W: a rank runs
  `Layout.accumulation_steps` = ceil(max count / micro_batch) micro-steps (G / (micro_batch x W)
  when that divides), and `RankStep.micro_batches(steps)` cuts its share into that many
  contiguous chunks of at most micro_batch samples.

A `RankView` is a pure function of (order, first step, W, rank): switching W at a step boundary
means building new views from the committed state; the old views are simply no longer read.
`RankView.ids_between(s, s + k)` answers a prefetcher's question "which samples does rank r
need in steps s..s+k".

Invariants:
- 1 <= W <= MAX_WORLD, 0 <= rank < W; W | G unless uneven; micro_batch >= 1;
- for every step the W slices are disjoint, their union is B, and their sizes differ by <= 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs
import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.order import Order
from tenplex.data.state import DataState

MAX_WORLD = 65536  # data-parallel ranks; a view is built per rank


def split_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s slice of a batch of `n` samples over `world` ranks."""
    q, m = divmod(n, world)
    start = rank * q + min(rank, m)
    return start, start + q + (rank < m)


def split_counts(n: int, world: int) -> tuple[int, ...]:
    q, m = divmod(n, world)
    return tuple(q + (r < m) for r in range(world))


def check_world(global_batch: int, world: int, uneven: bool = False) -> None:
    """Raises DataError unless `world` ranks may split global batches of `global_batch`."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise DataError(f"world: expected an integer >= 1, got {world!r}")
    if world > MAX_WORLD:
        raise DataError(f"world: {world} ranks are more than {MAX_WORLD}")
    if not uneven and global_batch % world:
        divisors = "" if global_batch > 10**6 else " (divisors: " + ", ".join(
            str(d) for d in range(1, global_batch + 1) if global_batch % d == 0) + ")"  # fmt: skip
        raise DataError(f"world: {world} ranks do not divide global batch {global_batch}{divisors}; "
                        "pass uneven=True (CLI: --uneven) to allow uneven splits")  # fmt: skip


@attrs.frozen
class Layout:
    """Per-rank batch and micro-steps for global batch G over W ranks."""

    global_batch: int
    world: int
    micro_batch: int
    uneven: bool = False

    def __attrs_post_init__(self) -> None:
        check_world(self.global_batch, self.world, self.uneven)
        if isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise DataError(f"micro_batch: expected an integer >= 1, got {self.micro_batch!r}")
        if not self.uneven and self.per_rank % self.micro_batch:
            raise DataError(f"micro_batch: {self.micro_batch} does not divide the {self.per_rank} samples per rank "
                            f"(global batch {self.global_batch} over {self.world} ranks)")  # fmt: skip

    @property
    def per_rank(self) -> int:
        """The largest per-rank share of a full batch (G/W when W | G)."""
        return math.ceil(self.global_batch / self.world)

    @property
    def accumulation_steps(self) -> int:
        return math.ceil(self.per_rank / self.micro_batch)


@attrs.frozen(eq=False)
class RankStep:
    """What rank `rank` of `world` reads at global step `step` (epoch `epoch`)."""

    epoch: int
    step: int
    rank: int
    world: int
    ids: np.ndarray = attrs.field(repr=lambda a: str(a.tolist()))
    global_count: int

    @property
    def count(self) -> int:
        return len(self.ids)

    def micro_batches(self, steps: int) -> list[np.ndarray]:
        """This rank's ids cut into `steps` contiguous chunks (sizes differ by <= 1)."""
        if steps < 1:
            raise DataError(f"steps: expected an integer >= 1, got {steps!r}")
        return [self.ids[slice(*split_bounds(self.count, steps, k))] for k in range(steps)]

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "rank": self.rank, "samples": self.ids.tolist()}


@attrs.frozen
class RankView:
    """Rank `rank` of `world` from global step `start` on."""

    order: Order
    start: int
    world: int
    rank: int
    uneven: bool = False

    def __attrs_post_init__(self) -> None:
        check_world(self.order.global_batch, self.world, self.uneven)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world:
            raise DataError(f"rank: {self.rank!r} is not in 0..{self.world - 1}")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise DataError(f"start: expected a step >= 0, got {self.start!r}")

    def step_at(self, step: int) -> RankStep:
        """This rank's share of global step `step` (>= start)."""
        if step < self.start:
            raise DataError(f"step: {step} is before this view's first step {self.start}")
        batch = self.order.batch(step)
        lo, hi = split_bounds(len(batch), self.world, self.rank)
        return RankStep(self.order.locate(step)[0], step, self.rank, self.world, batch[lo:hi], len(batch))

    def steps(self, stop: int | None = None) -> Iterator[RankStep]:
        """RankSteps for global steps start, start+1, ... up to `stop` (exclusive; None: forever)."""
        step = self.start
        while stop is None or step < stop:
            yield self.step_at(step)
            step += 1

    def ids_between(self, start: int, stop: int) -> np.ndarray:
        """The sample ids this rank reads in global steps [start, stop), in reading order."""
        parts = [self.step_at(s).ids for s in range(max(start, self.start), stop)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def rank_view(state: DataState, order: Order, world: int, rank: int, uneven: bool = False) -> RankView:
    """Rank `rank` of `world` from the step after `state`'s last committed step."""
    state.check_matches(global_batch=order.global_batch, seed=order.seed, tail_policy=order.tail_policy)
    return RankView(order, state.step(order), world, rank, uneven)
