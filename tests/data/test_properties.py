"""The reference harness (docs/dataset.md §10.3) on the order/partition API: the
delivered (epoch, step, rank, ids) log equals the oracle's under random and named rescale
schedules, and the checkable properties P1, P2, P4, P7, P10, P11 hold."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.data import DataError, DataState, Order, Schedule, rank_view, replay
from tests.data import oracle
from tests.data.helpers import raw_index
from tests.data.strategies import Job, jobs, schedules


def api_log(job: Job, plan: list, stop: int, start: int = 0, uneven: bool = False) -> list[tuple]:
    order = Order(job.n, job.g, job.seed, job.tail)
    steps = replay(order, Schedule(plan), stop, start, uneven)
    return [(s.epoch, s.step, s.rank, s.ids.tolist()) for s in steps]


def by_step(log: list[tuple]) -> dict[int, list[int]]:
    """Rank-major concatenation of every step's slices."""
    out: dict[int, list[int]] = defaultdict(list)
    for _, step, _, ids in sorted(log, key=lambda t: (t[1], t[2])):
        out[step] += ids
    return dict(out)


def check_epochs(job: Job, log: list[tuple], epochs: int) -> None:
    """P1: each epoch delivers every sample once, except the declared tail."""
    for e in range(epochs):
        ids = [i for epoch, _, _, part in log if epoch == e for i in part]
        declared = set(oracle.dropped(job.n, job.g, job.seed, job.tail, e))
        assert len(ids) == len(set(ids)) and set(ids) == set(range(job.n)) - declared


def check_against_uninterrupted(job: Job, log: list[tuple], stop: int) -> None:
    """P2 and P10: every step's batch, in order, is the 1-rank run's; its size does not depend on W."""
    single = by_step(api_log(job, [(0, 1)], stop))
    assert by_step(log) == single
    order = Order(job.n, job.g, job.seed, job.tail)
    assert {s: len(ids) for s, ids in single.items()} == {s: order.batch_size(s) for s in range(stop)}


@given(st.data())
def test_p1_p2_random_schedules_match_the_oracle(data):
    job = data.draw(jobs())
    uneven = data.draw(st.booleans())
    epochs = data.draw(st.integers(1, 3))
    stop = epochs * job.steps_per_epoch
    plan = data.draw(schedules(job, stop, uneven))
    log = api_log(job, plan, stop, uneven=uneven)
    assert log == job.oracle(plan, stop)
    check_epochs(job, log, epochs)
    check_against_uninterrupted(job, log, stop)


NAMED = [  # N, G, tail, schedule, uneven
    pytest.param(1200, 12, "drop", [(0, 4), (37, 3)], False, id="reference_4_to_3_at_37"),
    pytest.param(1201, 12, "drop", [(0, 4), (37, 3)], False, id="reference_4_to_3_n_1201"),
    pytest.param(1000, 60, "partial", [(0, 4), (3, 3), (7, 5), (12, 1)], False, id="4_3_5_1"),
    pytest.param(240, 24, "drop", [(0, 8), (4, 6)], False, id="dlrover_8_to_6"),
    pytest.param(100, 12, "drop", [(0, 4), (7, 3), (8, 6), (15, 2)], False, id="change_at_last_step_of_epoch"),
    pytest.param(50, 12, "partial", [(0, 3), (1, 4), (2, 6), (3, 2), (4, 12)], False, id="change_every_step"),
    pytest.param(103, 10, "partial", [(0, 4), (5, 3), (10, 7)], True, id="g_not_divisible_by_4_or_3"),
    pytest.param(9, 5, "partial", [(0, 4)], True, id="reference_panic_g5_w4"),
]


@pytest.mark.parametrize(("n", "g", "tail", "plan", "uneven"), NAMED)
def test_named_rescales(n, g, tail, plan, uneven):
    job = Job(n, g, 2024, tail)
    stop = 2 * job.steps_per_epoch
    log = api_log(job, plan, stop, uneven=uneven)
    assert log == job.oracle(plan, stop)
    check_epochs(job, log, 2)
    check_against_uninterrupted(job, log, stop)
    if g % 4 == 0 or uneven:
        four = by_step(api_log(job, [(0, 4)], stop, uneven=uneven))
        assert {s: set(ids) for s, ids in by_step(log).items()} == {s: set(ids) for s, ids in four.items()}


def test_rank_major_concatenation_is_the_global_batch():
    job = Job(40, 12, 1, "drop")
    order = Order(job.n, job.g, job.seed, job.tail)
    for step, ids in by_step(api_log(job, [(0, 4), (1, 3), (2, 6)], 3)).items():
        assert ids == order.batch(step).tolist()


@given(jobs(), st.integers(0, 2**64 - 1))
def test_p4_same_inputs_same_log(job, other_seed):
    stop = 2 * job.steps_per_epoch
    plan = [(0, job.divisors()[-1])]
    assert api_log(job, plan, stop) == api_log(Job(job.n, job.g, job.seed, job.tail), plan, stop)
    if job.n >= 12 and other_seed != job.seed:
        assert api_log(job, plan, stop) != api_log(Job(job.n, job.g, other_seed, job.tail), plan, stop)


@given(jobs())
def test_p7_the_tail_is_the_same_for_every_w(job):
    stop = 2 * job.steps_per_epoch
    sets = {
        w: {s: sorted(ids) for s, ids in by_step(api_log(job, [(0, w)], stop, uneven=True)).items()}
        for w in range(1, 9)
    }
    assert all(v == sets[1] for v in sets.values())
    order = Order(job.n, job.g, job.seed, job.tail)
    assert order.dropped(0).tolist() == oracle.dropped(job.n, job.g, job.seed, job.tail, 0)


@given(st.data())
def test_p11_new_views_start_exactly_at_the_switch(data):
    job = data.draw(jobs())
    stop = 2 * job.steps_per_epoch
    switch = data.draw(st.integers(0, stop - 1))
    old_w, new_w = data.draw(st.sampled_from(job.divisors())), data.draw(st.sampled_from(job.divisors()))
    index = raw_index(job.n)
    start = DataState.start(index, job.seed, job.g, job.tail)
    order = start.order_for(index)
    old = [rank_view(start, order, old_w, r) for r in range(old_w)]
    committed = start.commit(order, switch)
    new = [rank_view(committed, order, new_w, r) for r in range(new_w)]
    assert {v.start for v in new} == {switch}
    log = [(s.epoch, s.step, s.rank, s.ids.tolist()) for v in old for s in v.steps(switch)]
    log += [(s.epoch, s.step, s.rank, s.ids.tolist()) for v in new for s in v.steps(stop)]
    expected = job.oracle([(0, old_w), (switch, new_w)] if switch else [(0, new_w)], stop)
    assert sorted(log, key=lambda t: (t[1], t[2])) == expected
    if switch:
        with pytest.raises(DataError, match=f"step: {switch - 1} is before this view's first step {switch}"):
            new[0].step_at(switch - 1)


def test_rank_view_rejects_a_state_of_another_job():
    index = raw_index(10)
    state = DataState.start(index, 1, 2)
    with pytest.raises(DataError, match="^state: seed: the state has 1 but the job has 2$"):
        rank_view(state, Order(10, 2, 2), 1, 0)
