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
are the slots in sorted order. A slot's *level* is count // s + j; within a level the hosts
that have reached it come by (count % s, rank), so from the highest host's level on a run
repeats one cycle of its hosts, and a run costs its levels below that, not its atoms."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tenplex.compiler import keysort

I64 = np.int64


def least_sent_hosts(which: np.ndarray, sets: Sequence[Sequence[int]], nbytes: np.ndarray, n: int) -> np.ndarray:
    """The least-sent host (a number < n, which is its rank) of each atom in order (holder
    hosts `sets[which[i]]`, ascending, which do not change, sending `nbytes[i]` > 0), all
    counts starting at zero. Sets are joined into components that share hosts; each
    component's atoms are taken in order, in runs of one set and one size (one count per host,
    in rank order)."""
    if not len(which):
        return np.zeros(0, I64)
    number: dict[tuple[int, ...], int] = {}
    same = [number.setdefault(tuple(s), len(number)) for s in sets]
    which = np.array(same, I64)[which]  # equal host sets are one set
    members = list(number)
    component = _components(members, n)[which]
    order = keysort.lexsort((np.arange(len(which)), component))  # per component, in atom order
    w, sizes = which[order], nbytes[order]
    cuts = np.flatnonzero((w[1:] != w[:-1]) | (sizes[1:] != sizes[:-1])) + 1
    starts, stops = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(which)]))
    counts = [0] * n
    host: list[int] = []
    for a, b, k, s in zip(starts.tolist(), stops.tolist(), w[starts].tolist(), sizes[starts].tolist()):
        host += _run(counts, members[k], s, b - a)
    out = np.empty(len(which), I64)
    out[order] = host
    return out


class HolderHosts:
    """Holder sets (sorted holders, device first; `lens[i]` rows of `rows` each, in turn: device,
    sub-tensor id, piece) by host: each set's hosts (numbers below `n`, ascending) in `members`,
    and per (set, host) key `set * n + host` (sorted in `keys`) a run of `count` holders in set
    order, from `first` in `rows[order]`. Grouped by numpy for all sets at once (every need
    box's holder tuple is its own set: 11k sets of 161k holders at 1024 GPUs)."""

    def __init__(self, lens: np.ndarray, rows: np.ndarray, host_of: np.ndarray, n: int):
        self.rows = rows
        key = np.repeat(np.arange(len(lens)), lens) * n + host_of[rows[:, 0]]
        self.order = keysort.argsort(key)
        key = key[self.order]
        self.first = keysort.starts(key)
        self.keys, self.n = key[self.first], n
        self.count = np.diff(np.append(self.first, len(key)))
        runs = np.searchsorted(self.keys // n, np.arange(len(lens) + 1)).tolist()
        hosts = (self.keys % n).tolist()
        self.members = [hosts[a:b] for a, b in zip(runs[:-1], runs[1:])]


def _components(members: Sequence[Sequence[int]], n: int) -> np.ndarray:
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
        for h in hosts:
            if owner[h] < 0:
                owner[h] = j
            else:
                a, b = find(owner[h]), find(j)
                parent[max(a, b)] = min(a, b)
    return np.array([find(j) for j in range(len(members))], I64)


def _run(counts: list[int], hosts: Sequence[int], s: int, k: int) -> list[int]:
    """The hosts chosen for k atoms of s bytes over `hosts` (ascending: rank order), whose
    `counts` are updated: the k smallest (count + j*s, host) slots, in order, by levels."""
    level = {h: counts[h] // s for h in hosts}
    cycle = sorted(hosts, key=lambda h: (counts[h] % s, h))
    low, top = min(level.values()), max(level.values())
    out: list[int] = []
    for at in range(low, min(top, low + k)):  # each level below the top one adds a host at least
        out += [h for h in cycle if level[h] <= at]
        if len(out) >= k:
            del out[k:]
            break
    for h in out:
        counts[h] += s
    rounds, rest = divmod(k - len(out), len(cycle))  # whole cycles, then the first `rest` hosts
    for j, h in enumerate(cycle):
        counts[h] += (rounds + (j < rest)) * s
    return out + cycle * rounds + cycle[:rest]
