"""Least-sent source hosts of `select-sources`: the greedy choice, by heap and by runs.

Atoms are taken largest first; each is sent by the holder host that has sent the fewest bytes
so far (first in topology order on ties). `least_sent_hosts` makes those choices for a whole
sequence of atoms at once (the tests check it against a heap per holder set choosing one atom
at a time, `tests/compiler/test_scaling.py:LeastSent`). Holder sets that share no host (joined transitively:
a *component*) never affect each other's counts, so each component's atoms can be taken
apart, in their order. There, consecutive atoms of one set and one size s (DP replicas of a
stage hold most atoms, largest first, so runs are long) take the k smallest *slots*
(count + j·s, rank) over the set's hosts and j >= 0, in that order: after each choice the
chosen host's count grows by s, so the next smallest is never below the last, and the choices
are the slots in sorted order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

I64 = np.int64
SHORT_RUN = 8  # runs up to this long are chosen in Python: numpy costs more per call


def least_sent_hosts(sets: Sequence[Iterable[str]], nbytes: np.ndarray, rank: dict[str, int]) -> list[str]:
    """The least-sent host of each atom in order (holder hosts `sets[i]`, which do
    not change, sending `nbytes[i]` > 0), all counts starting at zero. Sets are joined into
    components that share hosts; each component's atoms are taken in order, in runs of one set
    and one size (one count per host, in rank order)."""
    if not len(sets):
        return []
    ids = list(map(id, sets))
    keys = {k: tuple(sorted(s, key=rank.__getitem__)) for k, s in dict(zip(ids, sets)).items()}
    distinct = list(dict.fromkeys(keys.values()))
    number = {key: j for j, key in enumerate(distinct)}
    of_id = {k: number[key] for k, key in keys.items()}
    which = np.fromiter(map(of_id.__getitem__, ids), I64, len(ids))
    names = sorted(rank, key=rank.__getitem__)
    members = [np.array([rank[h] for h in key], I64) for key in distinct]
    component = _components(members, len(names))[which]
    order = np.lexsort((np.arange(len(ids)), component))  # per component, in atom order
    w, sizes = which[order], nbytes[order]
    cuts = np.flatnonzero((w[1:] != w[:-1]) | (sizes[1:] != sizes[:-1])) + 1
    starts, stops = np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(ids)])).tolist()
    counts = np.zeros(len(names), I64)
    host = np.empty(len(ids), I64)
    for a, b in zip(starts, stops):
        hosts = members[int(w[a])]
        chosen, counts[hosts] = _run(counts[hosts], int(sizes[a]), b - a)
        host[a:b] = hosts[chosen]
    out = np.empty(len(ids), object)
    by_rank = np.empty(len(names), object)
    by_rank[:] = names
    out[order] = by_rank[host]
    return out.tolist()


def _components(members: list[np.ndarray], n: int) -> np.ndarray:
    """Per set (host numbers), the smallest set number of the sets it shares hosts with,
    transitively."""
    parent = list(range(len(members)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner = [-1] * n
    for j, hosts in enumerate(members):
        for h in hosts.tolist():
            if owner[h] < 0:
                owner[h] = j
            else:
                a, b = find(owner[h]), find(j)
                parent[max(a, b)] = min(a, b)
    return np.array([find(j) for j in range(len(members))], I64)


def _run(counts: np.ndarray, s: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(host positions chosen, counts after) for k atoms of s bytes over hosts with `counts`
    (in rank order): the k smallest (count + j*s, position) slots, in order."""
    m = len(counts)
    if k <= SHORT_RUN:
        c = counts.tolist()
        out = []
        for _ in range(k):
            h = min(range(m), key=c.__getitem__)  # the first of the least: rank order
            out.append(h)
            c[h] += s
        return np.array(out, I64), np.array(c, I64)
    j = min(k, k // m + int(counts.max() - counts.min()) // s + 2)  # enough slots per host
    slots = (counts[:, None] + s * np.arange(j)[None, :]).ravel()
    host = np.repeat(np.arange(m), j)
    chosen = host[np.lexsort((host, slots))[:k]]
    return chosen, counts + s * np.bincount(chosen, minlength=m)
