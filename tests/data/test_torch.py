"""The PyTorch path: RankSampler, RankBatchSampler, SampleDataset and RankIterableDataset
deliver exactly the oracle's per-rank sequence under rescales and resumes, with the indexed
bytes (P1, P2, P5, P6, P8); RankBatches delivers the same sequence step by step as views of its
shared chunk buffers, with 0 or 2 workers, whether its batches are dropped or held."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

from tenplex.data import (  # noqa: E402
    DataError,
    DatasetIndex,
    DataState,
    Layout,
    PrefetchConfig,
    Prefetcher,
    RankView,
    SampleReader,
    Schedule,
    rank_view,
)
from tenplex.data.torch_data import (  # noqa: E402
    RankBatches,
    RankBatchSampler,
    RankIterableDataset,
    RankSampler,
    SampleDataset,
)
from tests.data.helpers import write_npy_samples  # noqa: E402
from tests.data.strategies import Job, jobs, schedules  # noqa: E402

MAX_N = 60


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[DatasetIndex, bytes]:
    """MAX_N .npy samples in one file, and the file's bytes."""
    path = tmp_path_factory.mktemp("torch_data") / "samples.npy-stream"
    return write_npy_samples(path, MAX_N), path.read_bytes()


def first(index: DatasetIndex, n: int) -> DatasetIndex:
    """An index of the first n samples of `index` (one file)."""
    f = index.files[0]
    return DatasetIndex.from_files("numpy", index.root, [(f.name, f.size, index.offset[:n], index.length[:n])])


def per_rank(expected: list[tuple], start: int, stop: int, rank: int) -> list[int]:
    return [i for _, step, r, ids in expected if start <= step < stop and r == rank for i in ids]


def run_through_torch(index: DatasetIndex, job: Job, plan: list, stop: int, resume_at: list[int]) -> dict:
    """Per (segment start, rank): the ids from RankSampler + SampleDataset in a DataLoader and from
    RankIterableDataset, with the bytes, building every view from a saved and reloaded state."""
    reader = SampleReader(index, decode=False)
    state = DataState.start(index, job.seed, job.g, job.tail)
    bounds = sorted({0, stop, *resume_at, *(s for s, _ in plan if s < stop)})
    schedule, out = Schedule(plan), {}
    for a, b in zip(bounds, bounds[1:]):
        state = DataState.from_json(json.loads(state.dumps()))
        order = state.order_for(index)
        world = schedule.world_at(a)
        for r in range(world):
            view = rank_view(state, order, world, r, uneven=True)
            sampler = RankSampler(view, b - a)
            loaded = list(tud.DataLoader(SampleDataset(reader), sampler=sampler, batch_size=None))
            pairs = list(RankIterableDataset(reader, view, b - a))
            assert [i for i, _ in pairs] == list(sampler) and len(sampler) == len(pairs)
            assert [d for _, d in pairs] == loaded  # both access paths: same (id, bytes) sequence
            out[(a, r)] = pairs
        state = state.commit(order, b - a)
    return out


@settings(deadline=None)  # DataLoader set-up time varies with the machine's load
@given(st.data())
def test_torch_path_matches_the_oracle_under_rescales_and_resumes(dataset, data):
    base, blob = dataset
    job = data.draw(jobs(max_n=MAX_N))
    stop = data.draw(st.integers(1, 2)) * job.steps_per_epoch
    plan = data.draw(schedules(job, stop, uneven=True))
    resume_at = data.draw(st.lists(st.integers(1, stop), max_size=2))
    index = first(base, job.n)
    expected = job.oracle(plan, stop)
    bounds = sorted({0, stop, *resume_at, *(s for s, _ in plan if s < stop)})
    got = run_through_torch(index, job, plan, stop, resume_at)
    for (a, r), pairs in got.items():
        b = bounds[bounds.index(a) + 1]
        assert [i for i, _ in pairs] == per_rank(expected, a, b, r)
        for i, data_bytes in pairs:  # P8: the bytes are file[offset : offset + length]
            assert data_bytes == blob[base.offset[i] : base.offset[i] + base.length[i]]


def test_decoded_samples(dataset):
    base, _ = dataset
    view = RankView(DataState.start(base, 5, 6).order_for(base), 0, 3, 1)
    for i, array in RankIterableDataset(SampleReader(base), view, 2):
        np.testing.assert_array_equal(array, np.arange(i % 7 + 1, dtype=np.int32) * i)


def test_batch_sampler_gives_steps_and_micro_steps(dataset):
    base, _ = dataset
    state = DataState.start(base, 11, 12)
    order = state.order_for(base)
    view = rank_view(state, order, 2, 1)
    layout = Layout(12, 2, 2)
    batches = list(RankBatchSampler(view, 3, layout.accumulation_steps))
    assert len(batches) == 9 == len(RankBatchSampler(view, 3, 3)) and {len(b) for b in batches} == {2}
    assert sum(batches, []) == [i for s in range(3) for i in order.batch(s)[6:].tolist()]
    loader = tud.DataLoader(SampleDataset(SampleReader(base, decode=False)), batch_sampler=RankBatchSampler(view, 1))
    assert len(list(loader)) == 1


def test_p6_prefetched_but_uncommitted_steps_are_read_again(dataset):
    base, _ = dataset
    state = DataState.start(base, 3, 10, "partial")
    order = state.order_for(base)
    reader = SampleReader(base, decode=False)
    ahead = iter(RankIterableDataset(reader, rank_view(state, order, 2, 0), 4))
    consumed = [next(ahead)[0] for _ in range(5 * 3)]  # three steps read, committed only two
    state = DataState.from_json(json.loads(state.commit(order, 2).dumps()))
    resumed = [i for i, _ in RankIterableDataset(reader, rank_view(state, order, 5, 0), 2)]
    assert consumed[:10] == order.batch(0)[:5].tolist() + order.batch(1)[:5].tolist()
    assert resumed == order.batch(2)[:2].tolist() + order.batch(3)[:2].tolist()


@pytest.mark.multiprocess
def test_dataloader_workers_keep_the_order(dataset):
    base, _ = dataset
    state = DataState.start(base, 9, 8)
    view = rank_view(state, state.order_for(base), 4, 3)
    dataset_ = RankIterableDataset(SampleReader(base, decode=False), view, 6)
    alone = [(i, d) for i, d in dataset_]
    workers = list(tud.DataLoader(dataset_, batch_size=None, num_workers=2))
    assert [(int(i), bytes(d)) for i, d in workers] == alone
    assert (
        hashlib.sha256(b"".join(d for _, d in alone)).hexdigest()
        == hashlib.sha256(b"".join(bytes(d) for _, d in workers)).hexdigest()
    )


@pytest.mark.multiprocess
def test_prefetched_dataset_delivers_the_same_sequence(dataset):
    """P12 on the PyTorch path: a PrefetchConfig per DataLoader worker, or one Prefetcher kept
    across a rescale (4 -> 2 ranks) in the main process; decoded samples too."""
    base, _ = dataset
    state = DataState.start(base, 9, 8)
    order = state.order_for(base)
    reader = SampleReader(base, decode=False)
    view = rank_view(state, order, 4, 3)
    plain = list(RankIterableDataset(reader, view, 6))
    config = PrefetchConfig(budget_bytes=600, lookahead=2)
    workers = list(tud.DataLoader(RankIterableDataset(reader, view, 6, config), batch_size=None, num_workers=2))
    assert [(int(i), bytes(d)) for i, d in workers] == plain
    with Prefetcher(reader, budget_bytes=600) as shared:
        assert list(RankIterableDataset(reader, view, 3, shared)) == plain[:6]
        later = rank_view(state.commit(order, 3), order, 2, 1)
        assert list(RankIterableDataset(reader, later, 3, shared)) == list(RankIterableDataset(reader, later, 3))
        assert shared.stats().peak_bytes <= 600 and shared.stats().mismatched == 0
        decoded = RankIterableDataset(SampleReader(base), later, 1, shared)
        for i, array in decoded:
            np.testing.assert_array_equal(array, np.arange(i % 7 + 1, dtype=np.int32) * i)
        loader = iter(tud.DataLoader(RankIterableDataset(reader, later, 1, shared), batch_size=None, num_workers=2))
        with pytest.raises(DataError, match="prefetch: a Prefetcher serves one process; give DataLoader workers a PrefetchConfig"):
            list(loader)
        loader._shutdown_workers()  # now, not when a later test's gc finds it (it then waits 2 x 5 s on its workers)


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_rank_batches_deliver_the_steps_as_views(dataset, workers):
    base, _ = dataset
    state = DataState.start(base, 9, 8)
    view = rank_view(state, state.order_for(base), 2, 1)
    reader = SampleReader(base, decode=False)
    want = [(rank_step.step, rank_step.ids.tolist(), [reader.read(i) for i in rank_step.ids.tolist()])
            for rank_step in view.steps(5)]  # fmt: skip
    batches = RankBatches(reader, view, 5, workers, chunk_bytes=300, slots=2)
    assert len(batches) == 5 and len(batches.chunks) % 2 == 1 and all(len(c.steps) < 5 for c in batches.chunks)
    dropped = [(b.step, b.ids.tolist(), [bytes(d) for d in b.samples]) for b in batches]  # slots reused
    held = list(batches)  # more chunks than slots held at once: fresh buffers for the rest
    assert dropped == want == [(b.step, b.ids.tolist(), [bytes(d) for d in b.samples]) for b in held]
    assert all(isinstance(d, np.ndarray) and d.base is not None for b in held for d in b.samples)
    del held
    assert [(b.step, b.ids.tolist(), [bytes(d) for d in b.samples]) for b in batches] == want
    unfinished = iter(batches)  # a pass left after one step: the next pass still starts at view.start
    assert bytes(next(unfinished).samples[0]) == want[0][2][0]
    del unfinished
    for _ in range(2):  # passes go on from the workers' one stream, also where chunks do not split evenly
        assert [(b.step, b.ids.tolist(), [bytes(d) for d in b.samples]) for b in batches] == want
    for b in RankBatches(SampleReader(base), view, 2, 0, chunk_bytes=300):  # decoding runs in this process
        for i, array in zip(b.ids.tolist(), b.samples):
            np.testing.assert_array_equal(array, np.arange(i % 7 + 1, dtype=np.int32) * i)
    with pytest.raises(DataError, match=r"^RankBatches: workers -1 must be >= 0 and slots 8 >= 1$"):
        RankBatches(reader, view, 1, -1)


@pytest.mark.parametrize("workers", [0, 2])
def test_rank_batches_pass_over_a_slot_the_training_process_keeps(dataset, workers):
    """A view kept from one pass pins its slot: the next passes read into the other free slots
    (no fresh tensors, no waiting for the pinned one) and still deliver every step's bytes."""
    base, _ = dataset
    state = DataState.start(base, 9, 8)
    view = rank_view(state, state.order_for(base), 2, 1)
    reader = SampleReader(base, decode=False)
    want = [[reader.read(i) for i in rank_step.ids.tolist()] for rank_step in view.steps(5)]
    batches = RankBatches(reader, view, 5, workers, chunk_bytes=300, slots=4)
    kept = next(iter(batches)).samples[0]  # pins the slot of the first chunk
    ring = batches._slots.ring.numpy()
    for _ in range(3):
        got = []
        for b in batches:  # the loop keeps the last batch: one more slot in use at each fill
            got.append([bytes(d) for d in b.samples])
            assert all(np.shares_memory(d, ring) for d in b.samples), "a chunk went to a fresh tensor"
        assert got == want
    assert bytes(kept) == want[0][0]
