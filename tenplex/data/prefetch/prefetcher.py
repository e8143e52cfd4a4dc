"""Prefetching one rank's upcoming samples in the order training reads them, from peers first.

A `Prefetcher` runs one background thread that walks the rank's plan (`prefetch.plan.plan_slots`:
the (step, position, sample id) slots of a `RankView` for steps [view.start, stop), in reading
order; with DataLoader workers, only one worker's slots) and fetches each sample into a cache:
1. from the peer sources, in order: any object with `get(sample_id) -> bytes | None` (another
   rank's `Prefetcher`, a runtime store); an answer whose length is not the index's is ignored;
2. else from storage: `SampleReader.read` (local files or fsspec URLs).

Policy:
- window: only slots of steps [c, c + lookahead) are fetched, where c, the consumer's step, is the
  highest step `take`n so far (view.start after `start`);
- budget: cached bytes (spares included) plus the fetch in flight never exceed `budget_bytes`
  (the thread drops spares, else waits for room); a sample larger than the budget is never
  cached, its `take` reads it;
- eviction: `take` removes its sample; when c moves on, samples of earlier steps are dropped;
- `take(step, position, sample_id)` returns the sample's bytes: from the cache (a hit), once the
  fetch in flight for that slot lands (a wait), or by fetching it itself, peers first (a miss);
  a fetch that failed in the thread fails again here, in the consumer's thread, with its error;
- `start(view, stop)` retargets (a rescale or a resume): the old plan is dropped, cached samples
  that the new window needs are filed under their new slots, the rest stay as spares (served to
  peers, and filed when a later slot names them) until their room is needed, and a fetch still
  in flight for the old plan is discarded when it lands.

Invariants:
- a cached entry is served only for the slot and sample id it was filed under, so every `take`
  returns the bytes of the sample id it names (after a switch: the one the new view names);
- cached + in-flight bytes <= budget_bytes at all times (`PrefetchStats.peak_bytes` records it);
- budget_bytes >= 1 and lookahead >= 1.

Raises: `DataError` for bad settings, a closed prefetcher, or a prefetcher sent to another process.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from tenplex.data.errors import DataError
from tenplex.data.partition import RankView
from tenplex.data.prefetch.cache import SampleCache
from tenplex.data.prefetch.plan import COUNTS, PeerSource, PrefetchStats, Slot, plan_slots
from tenplex.data.reader import SampleReader

__all__ = ["DEFAULT_BUDGET", "PeerSource", "PrefetchConfig", "PrefetchStats", "Prefetcher", "Slot", "plan_slots"]

DEFAULT_BUDGET = 256 << 20
log = logging.getLogger(__name__)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"{name}: expected an integer >= 1, got {value!r}")


@attrs.frozen
class PrefetchConfig:
    """Settings from which each process (DataLoader worker) makes its own `Prefetcher`."""

    budget_bytes: int = DEFAULT_BUDGET
    lookahead: int = 2
    peers: tuple[Any, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        _positive("budget_bytes", self.budget_bytes)
        _positive("lookahead", self.lookahead)

    def create(self, reader: SampleReader) -> Prefetcher:
        return Prefetcher(reader, self.peers, self.budget_bytes, self.lookahead)


class Prefetcher:
    """A bounded cache of one rank's next `lookahead` steps, filled by a background thread."""

    def __init__(self, reader: SampleReader, peers: Sequence[PeerSource] = (), budget_bytes: int = DEFAULT_BUDGET,
                 lookahead: int = 2) -> None:  # fmt: skip
        PrefetchConfig(budget_bytes, lookahead)  # validates
        self.reader, self.peers, self.budget, self.lookahead = reader, tuple(peers), budget_bytes, lookahead
        self._cv = threading.Condition()
        self._gen, self._consumer, self._closed = 0, 0, False
        self._plan: Iterator[Slot] | None = None
        self._pending: Slot | None = None
        self._counts: collections.Counter[str] = collections.Counter()
        self._cache = SampleCache(budget_bytes, self._counts)
        self._wait_s = 0.0
        self._inflight: tuple[int, int, int] | None = None  # (generation, step, position)
        self._taken: set[tuple[int, int]] = set()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        raise DataError("a Prefetcher serves the process that made it; give DataLoader workers a PrefetchConfig")

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the consumer's side ---------------------------------------------------------------

    def start(self, view: RankView, stop: int | None, worker: int = 0, workers: int = 1,
              peers: Sequence[PeerSource] | None = None) -> None:  # fmt: skip
        """Prefetch `view`'s slots for steps [view.start, stop) from now on (module doc), from
        `peers` if given (a rescale changes who holds what), else the peers it had."""
        window = itertools.takewhile(lambda s: s.step < view.start + self.lookahead,
                                     plan_slots(self.reader.index, view, stop, worker, workers))  # fmt: skip
        with self._cv:
            if self._closed:
                raise DataError("prefetcher: start after close")
            self._gen += 1
            self.peers = self.peers if peers is None else tuple(peers)
            self._cache.refile(list(window))
            self._plan = plan_slots(self.reader.index, view, stop, worker, workers)
            self._pending, self._consumer = None, view.start
            self._taken.clear()
            self._cv.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tenplex-prefetch", daemon=True)
            self._thread.start()

    def take(self, step: int, position: int, sample_id: int) -> bytes:
        """The bytes of `sample_id`, the sample at `position` of `step` in the current plan."""
        with self._cv:
            self._advance(step)
            data = self._cached((step, position), sample_id)
            if data is not None:
                return data
            self._taken.add((step, position))
            self._counts["misses"] += 1
        data, source = self._fetch(sample_id)
        with self._cv:
            self._counts[f"{source}_samples"] += 1
            self._counts[f"{source}_bytes"] += len(data)
            self._counts["direct_bytes"] += len(data)
        return data

    def _cached(self, key: tuple[int, int], sample_id: int) -> bytes | None:
        """Under the lock: the slot's cached bytes (after its fetch in flight lands), or a spare
        copy of `sample_id`, removed from the cache; None for a miss."""
        waited = self._wait_for(key)
        entry = self._cache.entry(key)
        if entry is not None and entry[0] == sample_id:
            self._cache.drop(key)
            self._counts["waits" if waited else "hits"] += 1
            self._cv.notify_all()  # room for the thread
            return entry[1]
        self._counts["mismatched"] += entry is not None
        data = self._cache.take_spare(sample_id)
        if data is not None:
            self._counts["hits"] += 1
            self._cv.notify_all()
        return data

    def get(self, sample_id: int) -> bytes | None:
        """The bytes of `sample_id` if they are cached, else None: a prefetcher is a peer source."""
        with self._cv:
            return self._cache.get(sample_id)

    def stats(self) -> PrefetchStats:
        with self._cv:
            return PrefetchStats(self.budget, self._cache.peak, self._wait_s, **{k: self._counts[k] for k in COUNTS})

    @property
    def cached_bytes(self) -> int:
        """Bytes cached plus the fetch in flight."""
        return self._cache.nbytes

    def close(self) -> None:
        """Stop the thread and drop the cache; `take` and `start` are errors afterwards."""
        with self._cv:
            self._closed = True
            self._plan, self._pending = None, None
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._cv:
            self._cache.clear()

    # -- under the lock -----------------------------------------------------------------------

    def _advance(self, step: int) -> None:
        if self._closed:
            raise DataError("prefetcher: take after close")
        if step <= self._consumer:
            return
        self._consumer = step
        self._cache.drop_before(step)
        self._taken = {k for k in self._taken if k[0] >= step}
        self._cv.notify_all()

    def _wait_for(self, key: tuple[int, int]) -> bool:
        start = time.perf_counter()
        waited = False
        while self._inflight == (self._gen, *key):
            waited = True
            self._cv.wait()
        if waited:
            self._wait_s += time.perf_counter() - start
        return waited

    def _next_slot(self) -> Slot | None:
        """The next slot to fetch, once it is in the window and fits the budget; None when closed."""
        while not self._closed:
            if self._pending is None and self._plan is not None:
                self._pending = next(self._plan, None)
                self._plan = self._plan if self._pending is not None else None
            slot = self._pending
            if slot is None:
                self._cv.wait()
                continue
            key = (slot.step, slot.position)
            if slot.step < self._consumer or key in self._taken or key in self._cache or slot.length > self.budget:
                self._pending = None  # passed, taken, refiled or too large: never fetched
                continue
            if slot.step >= self._consumer + self.lookahead:
                self._cv.wait()
                continue
            if self._cache.reuse(slot):
                self._pending = None
                continue
            if not self._cache.make_room(slot.length):
                self._cv.wait()
                continue
            self._pending, self._inflight = None, (self._gen, *key)
            self._cache.reserve(slot.length)
            return slot
        return None

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                slot, gen = self._next_slot(), self._gen
            if slot is None:
                return
            try:
                data, source = self._fetch(slot.sample_id)
            except Exception as e:  # the consumer's own read of this slot raises it again
                log.debug("prefetch of sample %d failed: %s", slot.sample_id, e)
                data, source = None, None
            with self._cv:
                self._land(gen, slot, data, source)

    def _land(self, gen: int, slot: Slot, data: bytes | None, source: str | None) -> None:
        key = (slot.step, slot.position)
        self._inflight = None
        if source is not None:
            self._counts[f"{source}_samples"] += 1
            self._counts[f"{source}_bytes"] += slot.length
        if data is None or gen != self._gen or slot.step < self._consumer or key in self._taken or self._closed:
            self._cache.release(slot.length)
            self._counts["discarded_bytes"] += len(data or b"")
        else:
            self._cache.file(key, slot.sample_id, data)  # the reservation becomes the entry's bytes
        self._cv.notify_all()

    def _fetch(self, sample_id: int) -> tuple[bytes, str]:
        """(bytes, "peer" | "storage"): the first peer's answer of the right length, else storage."""
        length = int(self.reader.index.length[sample_id])
        for peer in self.peers:
            try:
                data = peer.get(sample_id)
            except Exception as e:  # a failing peer is skipped, like one without the sample
                log.debug("peer %r failed on sample %d: %s", peer, sample_id, e)
                data = None
            if data is not None and len(data) == length:
                return bytes(data), "peer"
            if data is not None:
                with self._cv:
                    self._counts["peer_rejected"] += 1
        return self.reader.read(sample_id), "storage"
