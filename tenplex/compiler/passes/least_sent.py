"""Least-sent source hosts of `select-sources`: the greedy choice, by heap and by runs.

Atoms are taken largest first; each is sent by the holder host that has sent the fewest bytes
so far (first in topology order on ties). `LeastSent` makes that choice one atom at a time,
from one heap per holder set. `least_sent_hosts` gives the same choices for a whole sequence
of atoms at once: holder sets that share no host never affect each other, and hosts of one
set (DP replicas of a stage) are usually no other set's, so per such set only its own atoms
matter, and a run of them of equal size s takes the k smallest *slots* (count + j·s, rank)
over its hosts and j >= 0, in that order: after each choice the chosen host's count grows by
s, so the next smallest is never below the last (the choices are the slots in sorted order).
Sets that share hosts with other sets keep the heap, one atom at a time.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

I64 = np.int64
SHORT_RUN = 8  # runs up to this long are chosen in Python: numpy costs more per call


class LeastSent:
    """Bytes sent per host, and the host of a holder set that has sent the fewest (first in
    `rank` order on ties), from one heap per set: O(log n) a choice instead of a scan of all
    holder hosts (which grow with DP). Counts only grow, so a heap entry whose count is stale
    is too small: it surfaces first and is pushed back with its count."""

    def __init__(self, rank: dict[str, int]):
        self.rank = rank
        self.sent: Counter[str] = Counter()
        self.heaps: dict[int, tuple[object, list[tuple[int, int, str]]]] = {}  # id(set) -> (set, heap)
        self.shared: dict[tuple[str, ...], list[tuple[int, int, str]]] = {}  # equal sets share a heap

    def add(self, host: str, nbytes: int) -> None:
        self.sent[host] += nbytes

    def least(self, hosts: Iterable[str]) -> str:
        """`hosts` must not change while it is used here (the heap is kept by its id)."""
        entry = self.heaps.get(id(hosts))
        if entry is None:
            key = tuple(sorted(hosts))
            if key not in self.shared:  # one heap per distinct set: a count goes stale in few heaps
                self.shared[key] = [(self.sent[h], self.rank[h], h) for h in key]
                heapq.heapify(self.shared[key])
            entry = self.heaps[id(hosts)] = (hosts, self.shared[key])  # keeps `hosts` alive for id()
        heap, sent = entry[1], self.sent
        while heap[0][0] != sent[heap[0][2]]:
            _, rank, h = heap[0]
            heapq.heapreplace(heap, (sent[h], rank, h))
        return heap[0][2]


def least_sent_hosts(sets: Sequence[Iterable[str]], nbytes: np.ndarray, rank: dict[str, int]) -> list[str]:
    """The host `LeastSent` chooses for each atom in order (holder hosts `sets[i]`, which do
    not change, sending `nbytes[i]` > 0), all counts starting at zero."""
    ids = list(map(id, sets))
    keys = {k: tuple(sorted(s, key=rank.__getitem__)) for k, s in dict(zip(ids, sets)).items()}
    distinct = list(dict.fromkeys(keys.values()))
    number = {key: j for j, key in enumerate(distinct)}
    of_id = {k: number[key] for k, key in keys.items()}
    which = np.fromiter(map(of_id.__getitem__, ids), I64, len(ids))
    out = np.empty(len(ids), object)
    alone = _alone(distinct)
    mixed = np.flatnonzero(~alone[which]).tolist()
    if mixed:
        least = LeastSent(rank)
        chosen = []
        for hosts, n in zip(map(sets.__getitem__, mixed), nbytes[mixed].tolist()):
            chosen.append(least.least(hosts))
            least.add(chosen[-1], n)
        out[mixed] = chosen
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(distinct) + 1))
    for j in np.flatnonzero(alone).tolist():
        at = order[bounds[j] : bounds[j + 1]]
        names = np.empty(len(distinct[j]), object)
        names[:] = distinct[j]
        out[at] = names[_by_runs(len(names), nbytes[at])]
    return out.tolist()


def _alone(distinct: list[tuple[str, ...]]) -> np.ndarray:
    """Per distinct set: whether no other set shares a host with it."""
    owners: Counter[str] = Counter(h for key in distinct for h in key)
    return np.array([all(owners[h] == 1 for h in key) for key in distinct], bool)


def _by_runs(m: int, sizes: np.ndarray) -> np.ndarray:
    """Host positions (0..m-1, in rank order) the greedy chooses for atoms of `sizes` in order."""
    counts = np.zeros(m, I64)
    out = np.empty(len(sizes), I64)
    cuts = np.flatnonzero(sizes[1:] != sizes[:-1]) + 1
    starts, stops = np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(sizes)])).tolist()
    for a, b in zip(starts, stops):
        s, k = int(sizes[a]), b - a
        if k <= SHORT_RUN:
            c = counts.tolist()
            for i in range(a, b):
                h = min(range(m), key=c.__getitem__)  # the first of the least: rank order
                out[i] = h
                c[h] += s
            counts = np.array(c, I64)
            continue
        j = min(k, k // m + int(counts.max() - counts.min()) // s + 2)  # enough slots per host
        slots = (counts[:, None] + s * np.arange(j)[None, :]).ravel()
        host = np.repeat(np.arange(m), j)
        chosen = host[np.lexsort((host, slots))[:k]]
        out[a:b] = chosen
        counts += s * np.bincount(chosen, minlength=m)
    return out
