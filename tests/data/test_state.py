"""DataState: JSON round trip, loud mismatches, commit semantics (P5, P6, P10), epoch ends."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.data import DataError, DataState, Order, Schedule, rank_view, replay
from tests.data.helpers import raw_index
from tests.data.strategies import Job, jobs, schedules

INDEX = raw_index(10)


def test_state_json_is_the_documented_object(tmp_path):
    state = DataState.start(INDEX, seed=7, global_batch=4, tail_policy="partial")
    path = tmp_path / "state.json"
    state.save(path)
    doc = json.loads(path.read_text())
    assert doc == {"version": 1, "fingerprint": INDEX.fingerprint, "seed": 7, "epoch": 0, "cursor": 0,
                   "global_batch": 4, "tail_policy": "partial"}  # fmt: skip
    assert DataState.load(path) == state
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left behind


def test_commit_advances_by_steps_and_wraps_epochs():
    state = DataState.start(INDEX, seed=1, global_batch=4, tail_policy="partial")
    order = state.order_for(INDEX)
    assert order.steps_per_epoch == 3
    after = [state.commit(order, k) for k in range(7)]
    assert [(s.epoch, s.cursor) for s in after] == [(0, 0), (0, 4), (0, 8), (1, 0), (1, 4), (1, 8), (2, 0)]
    assert [s.step(order) for s in after] == list(range(7))
    assert [s.consumed_samples(order) for s in after] == [0, 4, 8, 10, 14, 18, 20]  # P10: epoch x N_eff + c


def test_state_at_an_epoch_end_resumes_at_the_next_epoch():
    state = DataState.start(INDEX, seed=3, global_batch=5)
    order = state.order_for(INDEX)
    end = DataState.from_json(json.loads(state.commit(order, 2).dumps()))
    assert (end.epoch, end.cursor) == (1, 0)
    view = rank_view(end, end.order_for(INDEX), world=1, rank=0)
    assert view.step_at(2).ids.tolist() == order.epoch(1)[:5].tolist()


def test_state_size_is_independent_of_w_and_n():
    small = DataState.start(raw_index(3), seed=0, global_batch=1)
    big = DataState(INDEX.fingerprint, 2**63, 10**6, "drop", 10**9, 10**12)
    assert sorted(small.to_json()) == sorted(big.to_json()) and len(big.dumps()) < 300


MISMATCH = [
    pytest.param(
        {"fingerprint": "f" * 64},
        f"run.json: fingerprint: the state has {INDEX.fingerprint!r} but the job has {'f' * 64!r}",
        id="fingerprint",
    ),
    pytest.param({"seed": 8}, "run.json: seed: the state has 7 but the job has 8", id="seed"),
    pytest.param({"global_batch": 2}, "run.json: global_batch: the state has 4 but the job has 2", id="global_batch"),
    pytest.param(
        {"tail_policy": "partial"},
        "run.json: tail_policy: the state has 'drop' but the job has 'partial'",
        id="tail_policy",
    ),
]


@pytest.mark.parametrize(("config", "message"), MISMATCH)
def test_mismatched_state_fails_loudly(config, message):
    state = DataState.start(INDEX, seed=7, global_batch=4)
    with pytest.raises(DataError, match="^" + re.escape(message) + "$"):
        state.check_matches("run.json", **config)


def test_state_for_another_index_fails():
    state = DataState.start(INDEX, seed=7, global_batch=4)
    with pytest.raises(
        DataError,
        match=f"^s: fingerprint: the state has '{INDEX.fingerprint}' but the job has '{raw_index(11).fingerprint}'$",
    ):
        state.order_for(raw_index(11), "s")


GOOD = {"version": 1, "fingerprint": "ab", "seed": 1, "epoch": 0, "cursor": 4, "global_batch": 4, "tail_policy": "drop"}
BAD_DOCS = [
    pytest.param({**GOOD, "version": 2}, "version: expected 1, got 2", id="version"),
    pytest.param({**GOOD, "cursor": 5}, "cursor: 5 is not a multiple of global_batch 4", id="cursor_off_batch"),
    pytest.param({**GOOD, "epoch": -1}, "epoch: expected an integer >= 0, got -1", id="negative_epoch"),
    pytest.param({**GOOD, "seed": True}, "seed: expected an integer >= 0, got True", id="bool_seed"),
    pytest.param({**GOOD, "global_batch": 0}, "global_batch: expected an integer >= 1, got 0", id="zero_batch"),
    pytest.param({**GOOD, "tail_policy": "pad"}, "tail_policy: 'pad' is not one of ['drop', 'partial']", id="tail"),
    pytest.param({**GOOD, "fingerprint": ""}, "fingerprint: expected a non-empty string, got ''", id="fingerprint"),
    pytest.param({k: v for k, v in GOOD.items() if k != "seed"}, "expected an object with the keys", id="missing_key"),
    pytest.param([1], "expected an object with the keys", id="not_an_object"),
]


@pytest.mark.parametrize(("doc", "message"), BAD_DOCS)
def test_bad_state_documents_name_the_field(tmp_path, doc, message):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="^" + re.escape(f"{path}: {message}")):
        DataState.load(path)


def test_unreadable_state_files(tmp_path):
    with pytest.raises(DataError, match="missing.json: cannot read"):
        DataState.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DataError, match="bad.json: not valid JSON"):
        DataState.load(tmp_path / "bad.json")
    state = DataState(INDEX.fingerprint, 1, 2, "drop", 0, 10)
    with pytest.raises(DataError, match="^cursor: 10 is not below the 10 samples of an epoch$"):
        state.order_for(INDEX)
    with pytest.raises(DataError, match="^steps: expected an integer >= 0, got -1$"):
        DataState.start(INDEX, 1, 2).commit(Order(10, 2, 1), -1)


def _resumed_log(job: Job, plan: list, stop: int, resume_at: list[int]) -> list[tuple]:
    """Run [0, stop) under `plan`, saving and reloading the state at each step in `resume_at`
    and building every rank's view anew from the loaded state."""
    index = raw_index(job.n)
    state = DataState.start(index, job.seed, job.g, job.tail)
    order = state.order_for(index)
    schedule, log = Schedule(plan), []
    bounds = sorted({0, stop, *resume_at})
    for a, b in zip(bounds, bounds[1:]):
        state = DataState.from_json(json.loads(state.dumps()))
        order = state.order_for(index)
        assert state.step(order) == a
        log += [(s.epoch, s.step, s.rank, s.ids.tolist()) for s in replay(order, schedule, b, start=a)]
        state = state.commit(order, b - a)
        assert state.consumed_samples(order) == order.consumed_samples(b)  # P10
    return log


@given(st.data())
def test_p5_resume_through_save_and_load_on_any_w(data):
    job = data.draw(jobs())
    stop = 2 * job.steps_per_epoch + 1
    plan = data.draw(schedules(job, stop))
    resume_at = data.draw(st.lists(st.integers(0, stop), max_size=3))  # includes epoch ends and twice per epoch
    assert _resumed_log(job, plan, stop, resume_at) == job.oracle(plan, stop)


@given(st.data())
def test_p6_only_committed_steps_count(data):
    job = data.draw(jobs())
    stop = 2 * job.steps_per_epoch
    committed = data.draw(st.integers(0, stop - 1))
    prefetched = data.draw(st.integers(0, stop - committed))  # the loader ran this far past the commit
    world, new_world = data.draw(st.sampled_from(job.divisors())), data.draw(st.sampled_from(job.divisors()))
    index = raw_index(job.n)
    state = DataState.start(index, job.seed, job.g, job.tail)
    order = state.order_for(index)
    views = [rank_view(state, order, world, r) for r in range(world)]
    for v in views:
        v.ids_between(0, committed + prefetched)
    saved = state.commit(order, committed).dumps()  # then the job died; only commits reached the state
    state = DataState.from_json(json.loads(saved))
    assert state == DataState.start(index, job.seed, job.g, job.tail).at_step(order, committed)
    before = [(s.epoch, s.step, s.rank, s.ids.tolist()) for s in replay(order, Schedule.constant(world), committed)]
    after = [
        (s.epoch, s.step, s.rank, s.ids.tolist())
        for s in replay(order, Schedule.constant(new_world), stop, state.step(order))
    ]
    assert before + after == job.oracle([(0, world), (committed, new_world)], stop)
