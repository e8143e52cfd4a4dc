"""Least-loaded holder devices of `select-sources`, host by host in steps.

`_State.least_loaded` chooses, atom by atom, the first candidate device with the least
`before + sent` and then adds the atom's bytes to that device's `sent`. An atom's candidates
are the holders of its set on the host chosen for it, so they all lie on that host: atoms on
different hosts never read or change one another's counts. The choices are therefore the same
when the j-th atoms of every host are taken together, step j after step j - 1 (at 1024 GPUs:
9,280 atoms on 128 hosts, 152 steps of numpy instead of 9,280 turns of Python); within a step
each atom's device is another host's, so the counts added are apart.
"""

from __future__ import annotations

import numpy as np

from tenplex.compiler import keysort

I64 = np.int64
_NEVER = 1 << 62  # a padding slot's load: above any byte count, so never the least


def steps(host: np.ndarray) -> int:
    """How many steps `by_steps` takes: the most atoms on one host."""
    return int(np.bincount(host).max()) if len(host) else 0


def by_steps(host: np.ndarray, which: np.ndarray, bounds: np.ndarray, devices: np.ndarray, before: np.ndarray,
             sizes: np.ndarray, sent: list[int]) -> np.ndarray:  # fmt: skip
    """Per atom i (in order, on host `host[i]`), the position in `devices` of its chosen
    candidate: the first least `before + sent` among the devices `bounds[which[i]]` ..
    `bounds[which[i] + 1] - 1` (`before`: a run per atom of those lengths, in turn), after
    which that device's `sent` grows by `sizes[i]`, exactly as one atom at a time.

    Invariant: the candidates of atoms on different hosts are different devices."""
    m, count = len(which), np.diff(bounds)
    lens = count[which]
    width = int(count.max(initial=1))
    pad = len(sent)  # a slot past every device: sent 0, load `_NEVER`
    load = np.append(np.array(sent, I64), 0)
    cand = np.full((len(count), width), pad, I64)
    cand[np.repeat(np.arange(len(count)), count), np.arange(len(devices)) - np.repeat(bounds[:-1], count)] = devices
    base = np.full((m, width), _NEVER, I64)
    base[np.repeat(np.arange(m), lens), np.arange(len(before)) - np.repeat(np.cumsum(lens) - lens, lens)] = before
    by_host = keysort.argsort(host)
    first = keysort.starts(host[by_host])
    rank = np.empty(m, I64)
    rank[by_host] = np.arange(m) - np.repeat(first, np.diff(np.append(first, m)))
    order = keysort.argsort(rank)  # step by step, atoms in order within each
    cuts = np.searchsorted(rank[order], np.arange(int(rank.max(initial=-1)) + 2)).tolist()
    chosen = np.empty(m, I64)
    for a, b in zip(cuts[:-1], cuts[1:]):
        at = order[a:b]
        ds = cand[which[at]]
        i = (base[at] + load[ds]).argmin(axis=1)
        chosen[at] = bounds[which[at]] + i
        load[ds[np.arange(b - a), i]] += sizes[at]
    return chosen
