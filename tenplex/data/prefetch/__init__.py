"""Prefetching one rank's upcoming samples in reading order: `plan` (the slots and the statistics),
`cache` (filed samples and spares within a byte budget), `prefetcher` (the thread that fills it)."""

from tenplex.data.prefetch.plan import PeerSource, PrefetchStats, Slot, plan_slots
from tenplex.data.prefetch.prefetcher import DEFAULT_BUDGET, PrefetchConfig, Prefetcher

__all__ = ["DEFAULT_BUDGET", "PeerSource", "PrefetchConfig", "PrefetchStats", "Prefetcher", "Slot", "plan_slots"]
