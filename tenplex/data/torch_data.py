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

Each object is a pure function of its view: it starts at `view.start` on every `__iter__` and
keeps no counter, so a resume is a new view built from the committed `DataState`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
