"""Rescale schedules: the data-parallel size W over global steps, and the replay of what every
rank reads under one.

A schedule is a list of (step, W) changes, written `0:4,37:3`: W ranks from that global step on
(steps count from the start of training, across epochs).

Invariants:
- at least one change; the first is at step 0; steps strictly increase; every W >= 1.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator

import attrs

from tenplex.data.errors import DataError
from tenplex.data.order import Order
from tenplex.data.partition import RankStep, RankView, check_world


def _changes(pairs: object) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((operator.index(s), operator.index(w)) for s, w in pairs)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise DataError(f"schedule: expected (step, W) integer pairs, got {pairs!r}") from None


@attrs.frozen
class Schedule:
    changes: tuple[tuple[int, int], ...] = attrs.field(converter=_changes)

    def __attrs_post_init__(self) -> None:
        if not self.changes or self.changes[0][0] != 0:
            raise DataError(f"schedule: must start at step 0, got {self.text() or 'nothing'}")
        for (a, _), (b, _) in zip(self.changes, self.changes[1:]):
            if b <= a:
                raise DataError(f"schedule: steps must increase, got {a} then {b}")
        for step, world in self.changes:
            if world < 1:
                raise DataError(f"schedule: step {step}: world {world} is not >= 1")

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """From `step:W[,step:W...]`, e.g. `0:4,37:3`."""
        pairs = []
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", part)
            if not m:
                raise DataError(f"schedule: {part.strip()!r} is not step:W (e.g. 0:4,37:3)")
            pairs.append((int(m[1]), int(m[2])))
        return cls(pairs)

    @classmethod
    def constant(cls, world: int) -> Schedule:
        return cls([(0, world)])

    def text(self) -> str:
        return ",".join(f"{s}:{w}" for s, w in self.changes)

    def world_at(self, step: int) -> int:
        return next(w for s, w in reversed(self.changes) if s <= step)

    def segments(self, stop: int) -> list[tuple[int, int, int]]:
        """(start, stop, W) for the runs of constant W within global steps [0, stop)."""
        bounds = [s for s, _ in self.changes if s < stop] + [stop]
        return [(a, b, self.world_at(a)) for a, b in zip(bounds, bounds[1:])]

    def check(self, global_batch: int, uneven: bool = False) -> None:
        """Raises DataError naming the first change whose W cannot split global batch G."""
        for step, world in self.changes:
            try:
                check_world(global_batch, world, uneven)
            except DataError as e:
                raise DataError(f"schedule: step {step}: {e}") from None


def replay(order: Order, schedule: Schedule, stop: int, start: int = 0, uneven: bool = False) -> Iterator[RankStep]:
    """What every rank reads at global steps [start, stop) under `schedule`, step-major then
    rank order."""
    schedule.check(order.global_batch, uneven)
    for a, b, world in schedule.segments(stop):
        lo = max(a, start)
        if lo >= b:
            continue
        views = [RankView(order, lo, world, r, uneven) for r in range(world)]
        for step in range(lo, b):
            yield from (v.step_at(step) for v in views)
