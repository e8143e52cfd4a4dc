"""What a prefetcher fetches and reports: the slots of a rank's plan, peer sources, statistics.

A slot is one position of one step of a rank's share: (step, position, sample id, length). A
rank's plan is its slots in reading order (`plan_slots`), the same order in which
`RankIterableDataset` and the FUSE view read them. A peer source is anything with
`get(sample_id) -> bytes | None` (another rank's `Prefetcher`; later the runtime's stores).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import attrs

from tenplex.data.index import DatasetIndex
from tenplex.data.partition import RankView

COUNTS = ("hits", "waits", "misses", "peer_samples", "storage_samples", "peer_bytes", "storage_bytes",
          "direct_bytes", "discarded_bytes", "reused_samples", "peer_rejected", "mismatched")  # fmt: skip


class PeerSource(Protocol):
    def get(self, sample_id: int) -> bytes | None: ...


@attrs.frozen
class Slot:
    """Position `position` of the rank's share of global step `step`: sample `sample_id`."""

    step: int
    position: int
    sample_id: int
    length: int


def plan_slots(
    index: DatasetIndex, view: RankView, stop: int | None, worker: int = 0, workers: int = 1
) -> Iterator[Slot]:
    """The slots of `view` for steps [view.start, stop) in reading order; of those, the ones at
    running positions p with p % workers == worker (a DataLoader worker's share)."""
    p = 0
    for rank_step in view.steps(stop):
        for position, sample_id in enumerate(rank_step.ids.tolist()):
            if p % workers == worker:
                yield Slot(rank_step.step, position, sample_id, int(index.length[sample_id]))
            p += 1


@attrs.frozen
class PrefetchStats:
    """Counts since the prefetcher was made. Hits, waits and misses count `take`s; samples and
    bytes from peers and from storage count every fetch, of which `direct_bytes` are the misses'
    own reads; `discarded_bytes` were fetched but never taken; `reused_samples` were kept across
    a `start`; `mismatched` takes named another sample than the plan's slot (a consumer whose
    view is not the prefetcher's plan: served correctly, by a read of its own)."""

    budget_bytes: int
    peak_bytes: int
    wait_s: float
    hits: int = 0
    waits: int = 0
    misses: int = 0
    peer_samples: int = 0
    storage_samples: int = 0
    peer_bytes: int = 0
    storage_bytes: int = 0
    direct_bytes: int = 0
    discarded_bytes: int = 0
    reused_samples: int = 0
    peer_rejected: int = 0
    mismatched: int = 0

    @property
    def hit_rate(self) -> float:
        """Takes served without a read of their own (hits and waits) / all takes."""
        takes = self.hits + self.waits + self.misses
        return (self.hits + self.waits) / takes if takes else 0.0
