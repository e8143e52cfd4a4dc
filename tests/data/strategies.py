"""Hypothesis strategies for the dataset tests: jobs (N, G, seed, tail) and rescale schedules
that stress the edges (a change at step 0, at the last step of an epoch, several in a row)."""

from __future__ import annotations

import attrs
from hypothesis import strategies as st

from tests.data import oracle


@attrs.frozen
class Job:
    n: int
    g: int
    seed: int
    tail: str

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.g if self.tail == "drop" else -(-self.n // self.g)

    def divisors(self) -> list[int]:
        return [w for w in range(1, min(self.g, 8) + 1) if self.g % w == 0]

    def oracle(self, schedule: list[tuple[int, int]], stop: int, start: int = 0) -> list[tuple]:
        return oracle.run(self.n, self.g, self.seed, self.tail, schedule, stop, start)


@st.composite
def jobs(draw, max_n: int = 60, max_g: int = 16) -> Job:
    tail = draw(st.sampled_from(["drop", "partial"]))
    n = draw(st.integers(1, max_n))
    g = draw(st.integers(1, min(max_g, n) if tail == "drop" else max_g))
    return Job(n, g, draw(st.integers(0, 2**64 - 1)), tail)


@st.composite
def schedules(draw, job: Job, stop: int, uneven: bool = False) -> list[tuple[int, int]]:
    """(step, W) changes over global steps [0, stop): W | G unless `uneven` (then W in 1..8)."""
    worlds = st.integers(1, 8) if uneven else st.sampled_from(job.divisors())
    s = job.steps_per_epoch
    edges = sorted({0, s - 1, s, 2 * s - 1, stop - 1} & set(range(stop)))
    steps = set(draw(st.lists(st.sampled_from(edges), max_size=3)))
    steps |= set(draw(st.lists(st.integers(0, stop - 1), max_size=3)))
    run_start = draw(st.integers(0, stop - 1))
    steps |= set(range(run_start, min(stop, run_start + draw(st.integers(0, 3)))))
    return [(step, draw(worlds)) for step in sorted(steps | {0})]
