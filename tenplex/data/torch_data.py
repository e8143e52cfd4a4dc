"""PyTorch access to what one data-parallel rank reads (the only module that imports torch).

- `SampleDataset(reader)`: map-style; item i is sample i, decoded (or its bytes).
- `RankSampler(view, steps)`: the rank's sample ids for `steps` global steps from `view.start`,
  in reading order; use it with `SampleDataset` in a `DataLoader`.
- `RankBatchSampler(view, steps, micro_steps)`: one list of ids per step, or per micro-step
  when `micro_steps` > 1 (see `Layout.accumulation_steps`); a `batch_sampler`.
- `RankIterableDataset(reader, view, steps, prefetch=None)`: the same sequence as (sample id,
  sample) pairs. With DataLoader workers, position p of the sequence goes to worker p %
  num_workers, so a `DataLoader(..., batch_size=None)` keeps the order. `prefetch` reads the
  samples through a `tenplex.data.prefetch.prefetcher.Prefetcher`: a `PrefetchConfig` (each worker makes its
  own, with the whole budget, and closes it at the end) or, in the main process only, a
  `Prefetcher` that outlives the dataset (retargeted to this view by each `__iter__`, so it keeps
  the samples that a rescaled rank shares with the previous view).

- `RankBatches(reader, view, steps, workers)`: one `StepBatch(step, ids, samples)` per step, in
  order, read by `workers` DataLoader worker processes in chunks of consecutive steps (about
  `chunk_bytes`) straight into shared memory: a sample is a numpy view of it (decoded when the
  reader decodes), so no sample is pickled or copied on its way to the training process. Each
  worker has `slots` chunk buffers; a buffer is reused once every view of its chunk is gone,
  and a worker that finds no free buffer sends its chunk in a fresh shared tensor instead
  (holding many batches costs memory, never a deadlock). The workers stream passes over the
  chunks without end through one DataLoader iterator kept for the object's life: a new pass
  costs no DataLoader restart, and its first chunks are read while the last pass is consumed
  (up to the DataLoader's prefetch); a pass left unfinished is skipped to its end (its chunks
  read, unseen) before the next one starts.

Each object is a pure function of its view: it starts at `view.start` on every `__iter__` and
keeps no counter, so a resume is a new view built from the committed `DataState`.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data as tud

from tenplex.data.errors import DataError
from tenplex.data.partition import RankView, split_bounds
from tenplex.data.prefetch.prefetcher import PrefetchConfig, Prefetcher, plan_slots
from tenplex.data.reader import SampleReader


def _count(view: RankView, steps: int) -> int:
    def share(step: int) -> int:
        lo, hi = split_bounds(view.order.batch_size(step), view.world, view.rank)
        return hi - lo

    return sum(share(s) for s in range(view.start, view.start + steps))


class SampleDataset(tud.Dataset):
    """Map-style dataset over every sample of the reader's index."""

    def __init__(self, reader: SampleReader):
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, sample_id: int) -> Any:
        return self.reader[sample_id]


class RankSampler(tud.Sampler[int]):
    """Sample ids of one rank for global steps [view.start, view.start + steps)."""

    def __init__(self, view: RankView, steps: int):
        self.view, self.steps = view, steps

    def __iter__(self) -> Iterator[int]:
        for rank_step in self.view.steps(self.view.start + self.steps):
            yield from rank_step.ids.tolist()

    def __len__(self) -> int:
        return _count(self.view, self.steps)


class RankBatchSampler(tud.Sampler[list[int]]):
    """One list of sample ids per step (or per micro-step) of one rank."""

    def __init__(self, view: RankView, steps: int, micro_steps: int = 1):
        self.view, self.steps, self.micro_steps = view, steps, micro_steps

    def __iter__(self) -> Iterator[list[int]]:
        for rank_step in self.view.steps(self.view.start + self.steps):
            for chunk in rank_step.micro_batches(self.micro_steps):
                yield chunk.tolist()

    def __len__(self) -> int:
        return self.steps * self.micro_steps


class RankIterableDataset(tud.IterableDataset):
    """(sample id, sample) pairs that one rank reads in global steps [view.start, view.start + steps)."""

    def __init__(self, reader: SampleReader, view: RankView, steps: int,
                 prefetch: PrefetchConfig | Prefetcher | None = None):  # fmt: skip
        self.reader, self.view, self.steps, self.prefetch = reader, view, steps, prefetch

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        info = tud.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if self.prefetch is not None:
            yield from self._prefetched(worker, workers)
            return
        for p, sample_id in enumerate(RankSampler(self.view, self.steps)):
            if p % workers == worker:
                yield sample_id, self.reader[sample_id]

    def _prefetched(self, worker: int, workers: int) -> Iterator[tuple[int, Any]]:
        shared = isinstance(self.prefetch, Prefetcher)
        if shared and workers > 1:
            raise DataError("prefetch: a Prefetcher serves one process; give DataLoader workers a PrefetchConfig")
        prefetcher = self.prefetch if shared else self.prefetch.create(self.reader)
        stop = self.view.start + self.steps
        try:
            prefetcher.start(self.view, stop, worker, workers)
            for slot in plan_slots(self.reader.index, self.view, stop, worker, workers):
                data = prefetcher.take(slot.step, slot.position, slot.sample_id)
                yield slot.sample_id, self.reader.decode(slot.sample_id, data) if self.reader.decode_samples else data
        finally:
            if not shared:
                prefetcher.close()

    def __len__(self) -> int:
        return _count(self.view, self.steps)


class StepBatch(NamedTuple):
    """What one rank reads at global step `step`: sample `ids[k]` is `samples[k]`."""

    step: int
    ids: np.ndarray
    samples: list[Any]


class _Chunk(NamedTuple):
    steps: list[tuple[int, np.ndarray]]  # (step, ids) of consecutive steps
    lengths: np.ndarray  # of every sample, in order


def plan_chunks(reader: SampleReader, view: RankView, steps: int, chunk_bytes: int) -> list[_Chunk]:
    """The rank's steps grouped into runs of consecutive steps of about `chunk_bytes` (at least one step)."""
    chunks: list[_Chunk] = []
    run: list[tuple[int, np.ndarray]] = []
    size = 0
    for rank_step in view.steps(view.start + steps):
        run.append((rank_step.step, rank_step.ids))
        size += int(reader.index.length[rank_step.ids].sum())
        if size >= chunk_bytes:
            chunks.append(_chunk(reader, run))
            run, size = [], 0
    return chunks + ([_chunk(reader, run)] if run else [])


def _chunk(reader: SampleReader, run: list[tuple[int, np.ndarray]]) -> _Chunk:
    ids = np.concatenate([i for _, i in run]) if run else np.zeros(0, np.int64)
    return _Chunk(run, reader.index.length[ids])


def _read_chunk(reader: SampleReader, chunk: _Chunk, out: np.ndarray) -> None:
    reader.read_many_into([i for _, ids in chunk.steps for i in ids.tolist()], memoryview(out))


class _Slots:
    """`slots` chunk buffers of `capacity` bytes per worker, in shared memory; `flags[slot]` is 1
    while the training process holds views of the chunk in `slot`."""

    def __init__(self, workers: int, slots: int, capacity: int) -> None:
        self.slots = slots
        self.ring = torch.empty((max(workers, 1) * slots, max(capacity, 1)), dtype=torch.uint8)
        self.flags = torch.zeros(max(workers, 1) * slots, dtype=torch.uint8)
        if workers:
            self.ring.share_memory_()
            self.flags.share_memory_()

    def fill(self, reader: SampleReader, chunk: _Chunk, worker: int, k: int, patience_s: float) -> tuple[int, Any]:
        """Read `chunk` (worker `worker`'s `k`-th) into a free slot of the worker's (slot k % slots
        first, then the next free one: a slot that the training process keeps a view of is passed
        over, not waited for), waiting up to `patience_s` while all are in use (a chunk in flight
        is released soon), else into a new tensor: (slot or -1, tensor or None)."""
        size, flags = int(chunk.lengths.sum()), self.flags.numpy()
        order = [worker * self.slots + (k + j) % self.slots for j in range(self.slots)]
        deadline = time.monotonic() + patience_s
        while (slot := next((s for s in order if not flags[s]), -1)) < 0 and time.monotonic() < deadline:
            time.sleep(0.0005)
        if slot < 0:
            out = torch.empty(size, dtype=torch.uint8)
            _read_chunk(reader, chunk, out.numpy())
            return -1, out
        flags[slot] = 1
        _read_chunk(reader, chunk, self.ring[slot, :size].numpy())
        return slot, None

    def view(self, slot: int, size: int) -> np.ndarray:
        """The first `size` bytes of `slot`, released (flag cleared) once no view of them is left."""
        data = np.frombuffer(memoryview(self.ring[slot, :size].numpy()), np.uint8)  # views of it keep it alive
        weakref.finalize(data, self.flags.numpy().__setitem__, slot, 0)
        return data


class _ChunkReader(tud.IterableDataset):
    """Worker side of `RankBatches`: an endless stream of passes over the chunks, item g (chunk
    g % len(chunks)) read by worker g % workers (`_Slots.fill`), the DataLoader's task order."""

    def __init__(self, reader: SampleReader, chunks: list[_Chunk], slots: _Slots) -> None:
        self.reader, self.chunks, self.slots = reader, chunks, slots

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        info, n = tud.get_worker_info(), len(self.chunks)
        items = itertools.count(info.id, info.num_workers) if n else ()
        for k, g in enumerate(items):
            yield (g % n, *self.slots.fill(self.reader, self.chunks[g % n], info.id, k, patience_s=0.05))


class RankBatches:
    """Step batches of one rank read by DataLoader workers into shared memory (module doc)."""

    def __init__(self, reader: SampleReader, view: RankView, steps: int, workers: int = 2, *,
                 chunk_bytes: int = 4 << 20, slots: int = 8) -> None:  # fmt: skip
        if workers < 0 or slots < 1:
            raise DataError(f"RankBatches: workers {workers} must be >= 0 and slots {slots} >= 1")
        self.reader, self.view, self.steps, self.workers = reader, view, steps, workers
        self.chunks = plan_chunks(reader, view, steps, chunk_bytes)
        self._slots = _Slots(workers, slots, max((int(c.lengths.sum()) for c in self.chunks), default=0))
        self._loader, self._stream, self._taken = None, None, 0
        if workers:
            dataset = _ChunkReader(reader, self.chunks, self._slots)
            self._loader = tud.DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=True,
                                          prefetch_factor=max(1, slots - 2))  # a slot to read into, one in use  # fmt: skip

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[StepBatch]:
        if self._loader is None:  # in this process: a held slot is not waited for
            filled = ((c, *self._slots.fill(self.reader, chunk, 0, c, 0.0)) for c, chunk in enumerate(self.chunks))
        else:
            filled = self._pass()
        for c, slot, tensor in filled:
            chunk = self.chunks[int(c)]
            data = tensor.numpy() if slot < 0 else self._slots.view(int(slot), int(chunk.lengths.sum()))
            yield from self._batches(chunk, data)
            del data

    def _pass(self) -> Iterator[tuple[int, int, Any]]:
        """One pass over the chunks from the workers' endless stream (one DataLoader iterator for
        the object's life: no restart per pass, and the workers read the next pass's first chunks
        while this one is consumed). The rest of a pass left unfinished is skipped first (its
        chunks are read, their slots freed unseen), so every pass starts at `view.start`."""
        n, flags = len(self.chunks), self._slots.flags.numpy()
        if n == 0:
            return
        if self._stream is None:
            self._stream = iter(self._loader)
        while self._taken % n:
            _, slot, _ = next(self._stream)
            self._taken += 1
            if slot >= 0:
                flags[slot] = 0
        for c in range(n):
            item = next(self._stream)
            self._taken += 1
            if int(item[0]) != c:
                raise DataError(f"RankBatches: worker sent chunk {int(item[0])} where chunk {c} was due")
            yield item

    def _batches(self, chunk: _Chunk, data: np.ndarray) -> Iterator[StepBatch]:
        ends = np.cumsum(chunk.lengths).tolist()
        starts, k = [0, *ends[:-1]], 0
        decode = self.reader.decode_samples
        for step, ids in chunk.steps:
            views = [data[starts[j] : ends[j]] for j in range(k, k + len(ids))]
            if decode:
                views = [self.reader.decode(int(i), v) for i, v in zip(ids.tolist(), views)]
            k += len(ids)
            yield StepBatch(step, ids, views)
