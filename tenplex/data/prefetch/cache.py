"""The prefetcher's cache: samples filed under the slot they were fetched for, spares kept from an
earlier plan, and the byte budget they share with the fetch in flight.

A filed entry is `(step, position) -> (sample id, bytes)`; it is served only for that slot and
sample id. A spare is a sample cached for an earlier plan (kept by sample id, oldest first): it
serves peers and is filed again when a slot of the new plan names it, until its room is needed.
`nbytes` counts filed and spare bytes plus bytes reserved for fetches in flight; `peak` is its
high-water mark.

Not thread-safe: the `Prefetcher` calls it under its lock, and wakes its waiters itself.

Invariants: `nbytes` is the sum of the bytes held plus those reserved; `make_room` never drops a
filed entry, only spares.
"""

from __future__ import annotations

import collections

from tenplex.data.prefetch.plan import Slot

__all__ = ["SampleCache"]

Key = tuple[int, int]  # (step, position)


class SampleCache:
    """Filed samples and spares within `budget` bytes; `counts` is the prefetcher's counters."""

    def __init__(self, budget: int, counts: collections.Counter[str]) -> None:
        self.budget, self.counts = budget, counts
        self.nbytes = self.peak = 0
        self._filed: dict[Key, tuple[int, bytes]] = {}
        self._by_id: dict[int, bytes] = {}
        self._spare: dict[int, bytes] = {}  # by sample id, oldest first

    def __contains__(self, key: Key) -> bool:
        return key in self._filed

    def entry(self, key: Key) -> tuple[int, bytes] | None:
        """(sample id, bytes) filed under `key`, or None."""
        return self._filed.get(key)

    def get(self, sample_id: int) -> bytes | None:
        """A cached copy of `sample_id` (filed or spare), or None: what a peer asks for."""
        data = self._by_id.get(sample_id)
        return self._spare.get(sample_id) if data is None else data

    def file(self, key: Key, sample_id: int, data: bytes) -> None:
        """File `data` under `key` (its bytes must already be counted in `nbytes`)."""
        self._filed[key] = (sample_id, data)
        self._by_id[sample_id] = data

    def drop(self, key: Key) -> bytes:
        """Remove the entry filed under `key` and return its bytes."""
        sample_id, data = self._filed.pop(key)
        if self._by_id.get(sample_id) is data:
            del self._by_id[sample_id]
        self.nbytes -= len(data)
        return data

    def drop_before(self, step: int) -> None:
        """Drop every entry of a step before `step` (the consumer has moved on)."""
        for key in [k for k in self._filed if k[0] < step]:
            self.counts["discarded_bytes"] += len(self.drop(key))

    def take_spare(self, sample_id: int) -> bytes | None:
        """Remove and return a spare copy of `sample_id`, or None."""
        data = self._spare.pop(sample_id, None)
        if data is not None:
            self.nbytes -= len(data)
        return data

    def refile(self, window: list[Slot]) -> None:
        """Turn every filed entry into a spare, then file the spares that `window` (the new plan's
        first slots) names under their new slots."""
        for key in list(self._filed):
            sample_id, data = self._filed[key][0], self.drop(key)
            if sample_id in self._spare:
                self.counts["discarded_bytes"] += len(data)
                continue
            self._spare[sample_id] = data
            self.nbytes += len(data)
        for slot in window:
            self.reuse(slot)

    def reuse(self, slot: Slot) -> bool:
        """File a spare copy of `slot`'s sample under `slot`; whether there was one."""
        data = self._spare.pop(slot.sample_id, None)
        if data is not None:
            self.file((slot.step, slot.position), slot.sample_id, data)
            self.counts["reused_samples"] += 1
        return data is not None

    def make_room(self, nbytes: int) -> bool:
        """Drop spares, oldest first, until `nbytes` more fit the budget; whether they fit."""
        while self.nbytes + nbytes > self.budget and self._spare:
            data = self._spare.pop(next(iter(self._spare)))
            self.nbytes -= len(data)
            self.counts["discarded_bytes"] += len(data)
        return self.nbytes + nbytes <= self.budget

    def reserve(self, nbytes: int) -> None:
        """Count a fetch in flight of `nbytes` (after `make_room` said it fits)."""
        self.nbytes += nbytes
        self.peak = max(self.peak, self.nbytes)

    def release(self, nbytes: int) -> None:
        """Uncount a fetch in flight that is not filed."""
        self.nbytes -= nbytes

    def clear(self) -> None:
        for key in list(self._filed):
            self.drop(key)
        self.nbytes -= sum(map(len, self._spare.values()))
        self._spare.clear()
