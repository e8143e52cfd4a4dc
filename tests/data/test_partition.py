"""Partition validity (P3) for every (G, W) with G <= 64 and W <= 16, layouts, micro-batches,
schedules and rank views; each verifier message once."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tenplex.data import DataError, Layout, Order, RankView, Schedule, split_bounds, split_counts
from tenplex.data.partition import RankStep, check_world
from tests.data import oracle


@pytest.mark.parametrize("g", range(1, 65))
def test_p3_every_split_of_g_over_1_to_16_ranks(g):
    batch = list(range(100, 100 + g))
    for w in range(1, 17):
        parts = [batch[slice(*split_bounds(g, w, r))] for r in range(w)]
        assert sum(parts, []) == batch  # disjoint, union is B, rank-major order is B's order
        assert [len(p) for p in parts] == list(split_counts(g, w)) and max(map(len, parts)) - min(map(len, parts)) <= 1
        assert parts == oracle.split(batch, w)
        if g % w == 0:
            check_world(g, w)
            assert {len(p) for p in parts} == {g // w}
        else:
            with pytest.raises(DataError, match=f"world: {w} ranks do not divide global batch {g}"):
                check_world(g, w)
            check_world(g, w, uneven=True)
            assert (min(map(len, parts)) == 0) == (g < w)  # an empty rank only when G < W, and counted


def test_reference_tenplex_cases_are_balanced():
    # the reference's ceil(G/n) chunks give (3,3,3,1), (3,3,3,3,0) and a crash for G=5, n=4
    assert split_counts(10, 4) == (3, 3, 2, 2)
    assert split_counts(12, 5) == (3, 3, 2, 2, 2)
    assert split_counts(5, 4) == (2, 1, 1, 1)


LAYOUTS = [  # G, W, micro_batch, uneven -> per_rank, accumulation_steps
    pytest.param(12, 4, 3, False, 3, 1, id="one_micro_step"),
    pytest.param(12, 3, 2, False, 4, 2, id="two_micro_steps"),
    pytest.param(12, 1, 2, False, 12, 6, id="one_rank_accumulates"),
    pytest.param(10, 4, 2, True, 3, 2, id="uneven_rounds_up"),
]


@pytest.mark.parametrize(("g", "w", "mbs", "uneven", "per_rank", "steps"), LAYOUTS)
def test_layout_keeps_the_global_batch(g, w, mbs, uneven, per_rank, steps):
    layout = Layout(g, w, mbs, uneven)
    assert (layout.per_rank, layout.accumulation_steps) == (per_rank, steps)
    if not uneven:
        assert layout.accumulation_steps * mbs * w == g


def test_micro_batches_split_a_rank_step_evenly():
    step = RankStep(0, 3, 1, 2, np.arange(7), 14)
    chunks = step.micro_batches(3)
    assert [c.tolist() for c in chunks] == [[0, 1, 2], [3, 4], [5, 6]]
    assert step.to_json() == {"epoch": 0, "step": 3, "rank": 1, "samples": list(range(7))}


def test_schedule_parse_and_segments():
    plan = Schedule.parse("0:4, 37:3,40:1")
    assert plan.changes == ((0, 4), (37, 3), (40, 1)) and plan.text() == "0:4,37:3,40:1"
    assert [plan.world_at(s) for s in (0, 36, 37, 39, 40, 99)] == [4, 4, 3, 3, 1, 1]
    assert plan.segments(39) == [(0, 37, 4), (37, 39, 3)]


def test_rank_view_serves_only_its_steps():
    order = Order(20, 4, 9)
    view = RankView(order, 3, 2, 1)
    assert view.step_at(3).ids.tolist() == order.batch(3)[2:].tolist()
    assert view.ids_between(0, 5).tolist() == np.concatenate([order.batch(s)[2:] for s in (3, 4)]).tolist()
    assert [s.step for s in view.steps(6)] == [3, 4, 5]
    with pytest.raises(DataError, match="step: 2 is before this view's first step 3"):
        view.step_at(2)


BAD = [
    pytest.param(lambda: Schedule.parse("1:4"), "schedule: must start at step 0, got 1:4", id="no_step_0"),
    pytest.param(
        lambda: Schedule.parse("0:4,5:2,5:1"), "schedule: steps must increase, got 5 then 5", id="repeated_step"
    ),
    pytest.param(lambda: Schedule.parse("0:4,x"), "schedule: 'x' is not step:W (e.g. 0:4,37:3)", id="garbage"),
    pytest.param(lambda: Schedule.parse("0:0"), "schedule: step 0: world 0 is not >= 1", id="zero_world"),
    pytest.param(
        lambda: Schedule.parse("0:4,3:5").check(12),
        "schedule: step 3: world: 5 ranks do not divide global batch 12 (divisors: 1, 2, 3, 4, 6, 12)",
        id="world_not_dividing",
    ),
    pytest.param(
        lambda: Layout(12, 4, 2),
        "micro_batch: 2 does not divide the 3 samples per rank (global batch 12 over 4 ranks)",
        id="micro_batch",
    ),
    pytest.param(lambda: Layout(12, 4, 0), "micro_batch: expected an integer >= 1, got 0", id="zero_micro_batch"),
    pytest.param(lambda: RankView(Order(8, 4, 0), 0, 2, 2), "rank: 2 is not in 0..1", id="rank_out_of_range"),
    pytest.param(
        lambda: RankView(Order(8, 4, 0), -1, 2, 0), "start: expected a step >= 0, got -1", id="negative_start"
    ),
    pytest.param(
        lambda: RankView(Order(8, 4, 0), 0, 0, 0), "world: expected an integer >= 1, got 0", id="zero_world_view"
    ),
    pytest.param(
        lambda: RankStep(0, 0, 0, 1, np.arange(2), 2).micro_batches(0),
        "steps: expected an integer >= 1, got 0",
        id="zero_micro_steps",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD)
def test_bad_layouts_name_the_field(make, message):
    with pytest.raises(DataError, match="^" + re.escape(message)):
        make()
