"""Time from a rescale to the first batch on every new rank, with and without the prefetcher.

The model (one process, a thread per rank, no FUSE; `python -m bench --only dataset` runs it):
- a raw dataset of 128 samples of 1 MiB (64 KiB with --quick) on tmpfs, global batch G = 16,
  W = 4 ranks for steps 0 and 1, then W = 2 from step K = 2 (B_K is the same set for any W);
- remote storage: a `SampleReader` behind a modelled 1 Gbit/s link per host (every rank is a
  host): a read holds its host's link for 1 ms + bytes / 125 MB/s (`time.sleep`), one read at a
  time per link;
- peers: the old ranks' prefetchers (lookahead 2: while step K-1 trains, steps K-1 and K are
  fetched from storage), reached over a 10 Gbit/s link each (0.1 ms + bytes / 1.25 GB/s).
At the switch every new rank starts at once and asks for its whole share of step K:
1. no prefetcher: it reads its samples from remote storage, one after the other;
2. prefetcher, storage only: a new `Prefetcher` with no peers;
3. prefetcher, peers first: a new `Prefetcher` whose peers are the old ranks' prefetchers;
4. prefetcher kept: new rank r keeps old rank r's `Prefetcher` (retargeted by `start`: the
   samples that the new view shares stay cached) with the other old ranks as peers.
Reported: seconds from the switch until every new rank holds its first batch (max over ranks),
and where the bytes came from.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tenplex.data import DatasetIndex, DataState, Prefetcher, RankView, SampleReader
from tenplex.data.prefetch.prefetcher import plan_slots

G, OLD_W, NEW_W, K, N, LOOKAHEAD = 16, 4, 2, 2, 128, 2
STORAGE_GBIT, STORAGE_LATENCY_S, PEER_GBIT, PEER_LATENCY_S = 1.0, 1e-3, 10.0, 1e-4
SCENARIOS = (("none", "no prefetcher: storage (1 Gbit/s)"), ("storage", "prefetcher: storage only"),
             ("peers", "prefetcher: peers (10 Gbit/s), then storage"),
             ("kept", "prefetcher kept across the switch + peers"))  # fmt: skip
HEADERS = ["scenario", "first batch s", "per new rank s", "from own cache", "from peers", "from storage", "speed-up"]


class Link:
    """A link that carries one transfer at a time: `latency_s` + bytes / rate, slept."""

    def __init__(self, gbit: float, latency_s: float) -> None:
        self.rate, self.latency_s, self._lock = gbit * 1e9 / 8, latency_s, threading.Lock()

    def carry(self, nbytes: int) -> None:
        with self._lock:
            time.sleep(self.latency_s + nbytes / self.rate)


class RemoteReader(SampleReader):
    """A SampleReader whose reads cross its own storage link (one per host)."""

    def __init__(self, index: Any) -> None:
        super().__init__(index, decode=False)
        self.link = Link(STORAGE_GBIT, STORAGE_LATENCY_S)

    def read(self, sample_id: int) -> bytes:
        data = super().read(sample_id)
        self.link.carry(len(data))
        return data


class LinkedPeer:
    """A peer source (another rank's prefetcher) behind its own link."""

    def __init__(self, source: Any) -> None:
        self.source, self.link = source, Link(PEER_GBIT, PEER_LATENCY_S)

    def get(self, sample_id: int) -> bytes | None:
        data = self.source.get(sample_id)
        if data is not None:
            self.link.carry(len(data))
        return data


def old_ranks(index: Any, state: Any, order: Any) -> list[Any]:
    """W = OLD_W prefetchers that trained steps [0, K) and then filled their windows."""
    olds = []
    for rank in range(OLD_W):
        view = RankView(order, 0, OLD_W, rank)
        p = Prefetcher(RemoteReader(index), budget_bytes=1 << 30, lookahead=LOOKAHEAD)
        p.start(view, order.steps_per_epoch)
        for slot in plan_slots(index, view, K):
            p.take(slot.step, slot.position, slot.sample_id)
        olds.append((p, view.ids_between(K, K - 1 + LOOKAHEAD).tolist()))  # its window: [K-1, K-1+L), not yet taken
    deadline = time.monotonic() + 60
    while not all(p.get(i) is not None for p, ids in olds for i in ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the old ranks did not fill their windows in 60 s: {[p.stats() for p, _ in olds]}")
        time.sleep(0.005)
    return [p for p, _ in olds]


def first_batch(scenario: str, index: Any, order: Any, rank: int, olds: list[Any]) -> tuple[float, dict]:
    """Seconds for new rank `rank` to hold its share of step K, and where its bytes came from."""
    view = RankView(order, K, NEW_W, rank)
    t0 = time.perf_counter()
    if scenario == "none":
        reader = RemoteReader(index)
        size = sum(len(reader.read(i)) for i in view.ids_between(K, K + 1).tolist())
        return time.perf_counter() - t0, {"storage_bytes": size}
    peers = [
        LinkedPeer(p)
        for r, p in enumerate(olds)
        if scenario in ("peers", "kept") and not (scenario == "kept" and r == rank)
    ]
    if scenario == "kept":
        p = olds[rank]
    else:
        p = Prefetcher(RemoteReader(index), budget_bytes=1 << 30, lookahead=LOOKAHEAD)
    before = p.stats()
    p.start(view, order.steps_per_epoch, peers=peers)
    for slot in plan_slots(index, view, K + 1):
        p.take(slot.step, slot.position, slot.sample_id)
    seconds, after = time.perf_counter() - t0, p.stats()
    reused = sum(int(index.length[i]) for i in view.ids_between(K, K + 1).tolist()) - (
        after.peer_bytes - before.peer_bytes) - (after.storage_bytes - before.storage_bytes)  # fmt: skip
    p.close()
    return seconds, {"peer_bytes": after.peer_bytes - before.peer_bytes, "cache_bytes": max(0, reused),
                     "storage_bytes": after.storage_bytes - before.storage_bytes}  # fmt: skip


def run_scenario(scenario: str, index: Any, state: Any) -> dict[str, Any]:
    order = state.order_for(index)
    olds = old_ranks(index, state, order) if scenario != "none" else []
    results: list[Any] = [None] * NEW_W
    start = threading.Barrier(NEW_W)

    def rank_thread(rank: int) -> None:
        start.wait()
        results[rank] = first_batch(scenario, index, order, rank, olds)

    threads = [threading.Thread(target=rank_thread, args=(r,)) for r in range(NEW_W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in olds:
        p.close()
    totals = {k: sum(r[1].get(k, 0) for r in results) for k in ("cache_bytes", "peer_bytes", "storage_bytes")}
    return {"scenario": scenario, "status": "ok", "first_batch_s": max(r[0] for r in results),
            "per_rank_s": [r[0] for r in results], **totals}  # fmt: skip


def run(quick: bool) -> dict[str, Any]:
    """All scenarios on a fresh dataset: {"model": ..., "rows": [...]}."""
    import numpy as np

    sample = (64 << 10) if quick else (1 << 20)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        (Path(d) / "data.bin").write_bytes(np.random.default_rng(0).integers(0, 256, N * sample, np.uint8).tobytes())
        index = DatasetIndex.from_files("raw", d, [("data.bin", N * sample, np.arange(N) * sample, np.full(N, sample))])
        state = DataState.start(index, 7, G)
        rows = [
            {**run_scenario(s, index, state), "name": f"rescale: {label}", "label": label} for s, label in SCENARIOS
        ]
    base = rows[0]["first_batch_s"]
    for r in rows:
        r["speedup"] = base / r["first_batch_s"]
    model = {"sample_bytes": sample, "samples": N, "global_batch": G, "old_world": OLD_W, "new_world": NEW_W,
             "switch_step": K, "lookahead": LOOKAHEAD, "storage_gbit": STORAGE_GBIT, "storage_latency_s": STORAGE_LATENCY_S,
             "peer_gbit": PEER_GBIT, "peer_latency_s": PEER_LATENCY_S}  # fmt: skip
    return {"model": model, "rows": rows}


def cells(result: dict[str, Any]) -> list[list[str]]:
    from bench.report import fmt_bytes

    return [[r["label"], f"{r['first_batch_s']:.3f}", " / ".join(f"{x:.3f}" for x in r["per_rank_s"]),
             fmt_bytes(r["cache_bytes"]), fmt_bytes(r["peer_bytes"]), fmt_bytes(r["storage_bytes"]),
             f"{r['speedup']:.1f}x"] for r in result["rows"]]  # fmt: skip


def _title(result: dict[str, Any]) -> str:
    from bench.report import fmt_bytes

    m = result["model"]
    return (f"Rescale W {m['old_world']} -> {m['new_world']} at step {m['switch_step']}: seconds until every new rank holds "
            f"its first batch ({G // NEW_W} samples of {fmt_bytes(m['sample_bytes'])}); storage {m['storage_gbit']:g} Gbit/s "
            f"+ {m['storage_latency_s'] * 1e3:g} ms per read, peers {m['peer_gbit']:g} Gbit/s")  # fmt: skip


def text(result: dict[str, Any]) -> str:
    from bench.report import text_table

    return _title(result) + "\n" + text_table(HEADERS, cells(result))


def markdown(result: dict[str, Any]) -> str:
    from bench.report import md_table

    return "\n".join(["## First batch after a rescale", "", _title(result) + ". The model is in the docstring of "
                      "bench/dataset_rescale.py (sleep-modelled links, one process).", "",
                      md_table(HEADERS, cells(result)), ""])  # fmt: skip
