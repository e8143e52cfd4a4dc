"""The prefetcher (P12 and P8 for prefetched bytes): under random rescale schedules, budgets,
lookaheads and peers, every rank's delivered (id, bytes) sequence equals the direct read's and
the oracle's, the budget is never exceeded, samples after a retarget are the new view's, peers
are asked before storage, and bad settings fail with messages that name the field."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.data import DataError, DatasetIndex, Order, PrefetchConfig, Prefetcher, RankView, SampleReader, Schedule
from tenplex.data.prefetch.prefetcher import plan_slots
from tests.data.helpers import write_raw_samples
from tests.data.strategies import jobs, schedules

MAX_N = 60


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> DatasetIndex:
    return write_raw_samples(tmp_path_factory.mktemp("prefetch") / "samples.bin", MAX_N)


def first(index: DatasetIndex, n: int) -> DatasetIndex:
    f = index.files[0]
    return DatasetIndex.from_files("raw", index.root, [(f.name, f.size, index.offset[:n], index.length[:n])])


class DictPeer:
    """A peer holding some samples; `bad` ones come back with the wrong length."""

    def __init__(self, reader: SampleReader, ids: set[int], bad: frozenset[int] = frozenset()):
        self.data = {i: reader.read(i) + (b"!" if i in bad else b"") for i in ids}
        self.asked: list[int] = []

    def get(self, sample_id: int) -> bytes | None:
        self.asked.append(sample_id)
        return self.data.get(sample_id)


class FailingPeer:
    def get(self, sample_id: int) -> bytes | None:
        raise RuntimeError("peer down")


class SlowReader(SampleReader):
    """Storage that takes `delay` seconds per sample, so the consumer catches up and waits."""

    def __init__(self, index: DatasetIndex, delay: float):
        super().__init__(index, decode=False)
        self.delay = delay

    def read(self, sample_id: int) -> bytes:
        time.sleep(self.delay)
        return super().read(sample_id)


def consume(prefetcher: Prefetcher, index: DatasetIndex, view: RankView, stop: int) -> list[tuple[int, bytes]]:
    prefetcher.start(view, stop)
    out = []
    for slot in plan_slots(index, view, stop):
        out.append((slot.sample_id, prefetcher.take(slot.step, slot.position, slot.sample_id)))
        assert prefetcher.cached_bytes <= prefetcher.budget
    return out


@settings(deadline=None, max_examples=40)
@given(st.data())
def test_p12_random_schedules_budgets_and_peers(index, data):
    job = data.draw(jobs(max_n=MAX_N))
    sub = first(index, job.n)
    reader = SampleReader(sub, decode=False)
    order = Order(job.n, job.g, job.seed, job.tail)
    stop = data.draw(st.integers(1, 2 * job.steps_per_epoch))
    plan = Schedule(data.draw(schedules(job, stop, uneven=True)))
    peer_ids = set(data.draw(st.lists(st.integers(0, job.n - 1), max_size=job.n)))
    peers = data.draw(st.sampled_from([(), (DictPeer(reader, peer_ids),), (FailingPeer(), DictPeer(reader, peer_ids, frozenset(list(peer_ids)[:3])))]))  # fmt: skip
    budget = data.draw(st.integers(1, 400))
    prefetchers = [Prefetcher(reader, peers, budget, data.draw(st.integers(1, 3))) for _ in range(8)]
    takes = [0] * 8
    expected = job.oracle(list(plan.changes), stop)
    for a, b, world in plan.segments(stop):
        cut = data.draw(st.integers(a + 1, b))  # the ranks stop early: their prefetched steps go stale
        for rank in range(world):
            view = RankView(order, a, world, rank, uneven=True)
            got = consume(prefetchers[rank], sub, view, cut)
            want = [i for _, s, r, ids in expected if a <= s < cut and r == rank for i in ids]
            assert got == [(i, reader.read(i)) for i in want]
            takes[rank] += len(got)
    for p, n in zip(prefetchers, takes):
        p.close()
        s = p.stats()
        assert s.peak_bytes <= budget and s.mismatched == 0 and p.cached_bytes == 0
        assert s.hits + s.waits + s.misses == n


def test_hits_waits_and_sources(index):
    reader = SlowReader(index, 0.002)
    order = Order(MAX_N, 12, 5)
    view = RankView(order, 0, 2, 1)
    peer = DictPeer(reader, set(view.ids_between(0, 2).tolist()))
    with Prefetcher(reader, [peer], budget_bytes=1 << 20, lookahead=2) as p:
        p.start(view, 4)
        time.sleep(0.2)  # the window (steps 0 and 1) arrives: from the peer
        got = [p.take(s.step, s.position, s.sample_id) for s in plan_slots(index, view, 4)]
        stats = p.stats()
    assert got == [reader.read(i) for i in view.ids_between(0, 4).tolist()]
    assert stats.hits >= 12 and stats.hits + stats.waits + stats.misses == 24
    assert stats.peer_samples == 12 and stats.peer_bytes == sum(index.length[view.ids_between(0, 2)])
    assert stats.storage_samples == 12 and stats.hit_rate == (stats.hits + stats.waits) / 24
    assert set(peer.asked) >= set(view.ids_between(0, 4).tolist())  # peers first, for every sample


def test_a_retarget_keeps_the_samples_the_new_view_shares(index):
    reader = SampleReader(index, decode=False)
    order = Order(MAX_N, 12, 5)
    old, new = RankView(order, 2, 2, 0), RankView(order, 2, 4, 1)  # new rank 1 of 4 = old rank 0's 2nd quarter
    with Prefetcher(reader, budget_bytes=1 << 20, lookahead=1) as p:
        p.start(old, 4)
        deadline = time.monotonic() + 5
        while p.stats().storage_samples < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert consume(p, index, new, 4) == [(i, reader.read(i)) for i in new.ids_between(2, 4).tolist()]
        stats = p.stats()
    assert stats.reused_samples == 3 and stats.hits >= 3 and stats.mismatched == 0


def test_a_consumer_with_another_view_gets_its_own_samples(index):
    """A take whose sample id is not the plan's is served by a read of its own, never the cached one."""
    reader = SampleReader(index, decode=False)
    order = Order(MAX_N, 12, 5)
    planned, other = RankView(order, 0, 2, 0), RankView(order, 0, 2, 1)
    with Prefetcher(reader, budget_bytes=1 << 20) as p:
        p.start(planned, 1)
        time.sleep(0.05)
        got = [(s.sample_id, p.take(s.step, s.position, s.sample_id)) for s in plan_slots(index, other, 1)]
        assert got == [(i, reader.read(i)) for i in other.ids_between(0, 1).tolist()]
        assert p.stats().mismatched == 6


def test_samples_larger_than_the_budget_are_read_by_the_consumer(index):
    reader = SampleReader(index, decode=False)
    view = RankView(Order(MAX_N, 6, 1), 0, 1, 0)
    with Prefetcher(reader, budget_bytes=10, lookahead=3) as p:
        assert consume(p, index, view, 5) == [(i, reader.read(i)) for i in view.ids_between(0, 5).tolist()]
        assert p.stats().peak_bytes <= 10


def test_a_failed_fetch_raises_in_the_consumer(index, tmp_path):
    path = tmp_path / "short.bin"
    broken = write_raw_samples(path, 10)
    path.write_bytes(path.read_bytes()[:5])  # truncated after indexing
    view = RankView(Order(10, 2, 1), 0, 1, 0)
    with Prefetcher(SampleReader(broken, decode=False)) as p:
        p.start(view, 1)
        slot = next(plan_slots(broken, view, 1))
        with pytest.raises(DataError, match=rf"^sample {slot.sample_id} of .*short.bin: read \d+ of \d+ bytes"):
            p.take(slot.step, slot.position, slot.sample_id)


def test_settings_and_lifecycle_errors(index):
    reader = SampleReader(index, decode=False)
    with pytest.raises(DataError, match=r"^budget_bytes: expected an integer >= 1, got 0$"):
        Prefetcher(reader, budget_bytes=0)
    with pytest.raises(DataError, match=r"^lookahead: expected an integer >= 1, got 0$"):
        PrefetchConfig(lookahead=0)
    p = Prefetcher(reader)
    with pytest.raises(
        DataError, match="^a Prefetcher serves the process that made it; give DataLoader workers a PrefetchConfig$"
    ):
        pickle.dumps(p)
    p.close()
    with pytest.raises(DataError, match="^prefetcher: start after close$"):
        p.start(RankView(Order(MAX_N, 6, 1), 0, 1, 0), 1)
    with pytest.raises(DataError, match="^prefetcher: take after close$"):
        p.take(0, 0, 0)


def test_the_budget_holds_while_the_consumer_races_the_thread(index):
    reader = SampleReader(index, decode=False)
    view = RankView(Order(MAX_N, 12, 3), 0, 3, 2)
    seen: list[int] = []
    with Prefetcher(reader, budget_bytes=64, lookahead=3) as p:
        watch = threading.Event()

        def monitor() -> None:
            while not watch.is_set():
                seen.append(p.cached_bytes)

        t = threading.Thread(target=monitor)
        t.start()
        try:
            for _ in range(3):
                assert consume(p, index, view, 5) == [(i, reader.read(i)) for i in view.ids_between(0, 5).tolist()]
        finally:
            watch.set()
            t.join()
        assert max(seen) <= 64 and p.stats().peak_bytes <= 64


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_samples_a_retarget_does_not_need_serve_peers_until_their_room_is_needed(index):
    reader = SampleReader(index, decode=False)
    order = Order(MAX_N, 12, 5)
    old, new = RankView(order, 0, 2, 0), RankView(order, 0, 2, 1)  # disjoint shares of step 0
    ids = old.ids_between(0, 1).tolist()
    budget = max(int(index.length[ids].sum()), int(index.length[new.ids_between(0, 1)].sum()))  # one window
    with Prefetcher(reader, budget_bytes=budget, lookahead=1) as p:
        p.start(old, 1)
        wait_until(lambda: p.stats().storage_samples == 6)
        p.start(new, 1)
        wait_until(lambda: p.stats().storage_samples == 12)
        assert p.get(ids[0]) is None and p.stats().peak_bytes <= budget  # the oldest spare made room first
        got = [(s.sample_id, p.take(s.step, s.position, s.sample_id)) for s in plan_slots(index, new, 1)]
        assert got == [(i, reader.read(i)) for i in new.ids_between(0, 1).tolist()]
    with Prefetcher(reader, budget_bytes=1 << 20, lookahead=1) as p:
        p.start(old, 1)
        wait_until(lambda: p.stats().storage_samples == 6)
        p.start(new, 1)
        assert [p.get(i) for i in ids] == [reader.read(i) for i in ids]  # room to spare: all kept
