"""Copies within a host, for `select-sources`: every need on every dst device at once.

A dst device that holds a src piece with the region reads it there (device class, the first
holder on the device); else a device on its host that holds it sends it (host class, the
least-loaded such device, in need and device order, cut to the message size limit); else the
region crosses the network (the want goes to the atoms, per dst host and tensor). The device
class is most of a large plan and needs no choice, so it is found for all wants by numpy: a
want (need, device) looks its (holder set, device) up among the keys of the holder sets.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, is_

import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.holders import holder_rows
from tenplex.compiler.ops import Need
from tenplex.compiler.passes.atoms import Far

I64 = np.int64
_HOLDERS, _DEVICES, _BOX = attrgetter("holders"), attrgetter("dst_devices"), attrgetter("box")
_TENSOR, _SID, _PIECE = attrgetter("tensor"), attrgetter("dst_subtensor"), attrgetter("dst_piece")


def local_copies(state, needs: list[Need]) -> tuple[np.ndarray, Far]:
    """(rows of the copies within a host, in need order then device order: tensor, box, src
    device, sub-tensor and piece, dst device, sub-tensor and piece; the wants that cross the
    network)."""
    group, (lens, ints), counts, devs, per_need = _read_needs(state, needs)
    n = len(needs)
    of = np.repeat(np.arange(n), counts)  # each want's need
    ndev = max(state.host) + 1
    host_ix = {h: i for i, h in enumerate(state.host_rank)}
    host_of = np.zeros(ndev, I64)
    host_of[list(state.host)] = [host_ix[h] for h in state.host.values()]
    on_dev, first, on_host = _keys(lens, ints, ndev, host_of, len(host_ix))
    key = group[of] * ndev + devs
    at = np.minimum(np.searchsorted(on_dev, key), max(len(on_dev) - 1, 0))
    here = on_dev[at] == key if len(on_dev) else np.zeros(len(key), bool)
    rest = np.flatnonzero(~here)  # the host class is looked up only for these (half, at 1024 GPUs)
    near = keysort.member(on_host, group[of[rest]] * len(host_ix) + host_of[devs[rest]])
    w = np.flatnonzero(here)
    rows = _with_host_class(state, needs, of, devs, rest[near], w, _device_rows(per_need[of[w]], first[at[w]], devs[w]))
    return rows, _remote(needs, of, devs, rest[~near], host_of, list(host_ix), state, per_need)


def _device_rows(per_need: np.ndarray, holder: np.ndarray, devs: np.ndarray) -> np.ndarray:
    """Rows of device-class copies from each want's need row (tensor, box, dst sub-tensor,
    piece), holder row (device, sub-tensor, piece) and dst device, written in place (one
    gather of the need rows, no stack of eight column pieces)."""
    rows = np.empty((len(devs), 8), I64)
    rows[:, :2], rows[:, 2:5], rows[:, 5], rows[:, 6:] = per_need[:, :2], holder, devs, per_need[:, 2:]
    return rows


def _read_needs(state, needs: list[Need]) -> tuple:
    """Per need its holder set's number (distinct holder tuples, by object, in order of first
    appearance), the rows of those sets (`holder_rows`), dst device counts, the dst devices in
    turn, and `_per_need`'s rows. From the diff's columns when `needs` are its needs."""
    d = state.p.diff
    if d is None or d.table is None or len(d.needs) != len(needs) or not all(map(is_, d.needs, needs)):
        ids = list(map(id, map(_HOLDERS, needs)))
        sets = dict(zip(ids, map(_HOLDERS, needs)))
        number = {k: i for i, k in enumerate(sets)}
        group = np.fromiter(map(number.__getitem__, ids), I64, len(needs))
        counts = np.fromiter(map(len, map(_DEVICES, needs)), I64, len(needs))
        devs = np.fromiter(chain.from_iterable(map(_DEVICES, needs)), I64, int(counts.sum()))
        return group, holder_rows(list(sets.values()), state.sid_ix), counts, devs, _per_need(state, needs)
    c = d.table.columns()
    group, firsts = _by_first(c.set_t * (int(c.set_g.max(initial=0)) + 1) + c.set_g)
    holders = needs[0].holders.key[0] if needs else None  # `HolderSets` of the diff
    sets = holders.rows(c.set_g[firsts], c.set_t[firsts]) if holders is not None else (np.zeros(0, I64), np.zeros((0, 3), I64))
    box, box_firsts = _by_first(c.box)
    number = np.array([state.box_id(d.table.boxes[b]) for b in c.box[box_firsts].tolist()], I64)
    dst_ix = np.fromiter(map(state.sid_ix.__getitem__, state.dst_ids), I64, len(state.dst_ids))  # `NeedTable`'s dst numbers
    per_need = np.stack((c.tensor, number[box] if len(number) else box, dst_ix[c.dst], c.piece), axis=1)
    return group, sets, c.count, c.devices, per_need


def _per_need(state, needs: list[Need]) -> np.ndarray:
    """Rows (tensor, box id, dst sub-tensor id, piece) per need. Needs share their box objects
    (a diff fragment serves every tensor of its kind), so `box_id` runs once per distinct
    object, in order of first appearance (the order it would number them in)."""
    n = len(needs)
    boxes = list(map(_BOX, needs))
    keys = list(map(id, boxes))
    number = {k: state.box_id(b) for k, b in dict(zip(keys, boxes)).items()}
    out = np.empty((n, 4), I64)
    out[:, 0] = np.fromiter(map(state.tensor_ix.__getitem__, map(_TENSOR, needs)), I64, n)
    out[:, 1] = np.fromiter(map(number.__getitem__, keys), I64, n)
    out[:, 2] = np.fromiter(map(state.sid_ix.__getitem__, map(_SID, needs)), I64, n)
    out[:, 3] = np.fromiter(map(_PIECE, needs), I64, n)
    return out


def _by_first(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's distinct value numbered in order of first appearance, and the first row of
    each number."""
    _, first, inverse = keysort.unique_first(keys)
    rank = np.empty(len(first), I64)
    by = keysort.argsort(first)
    rank[by] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[by]


def _remote(needs, of, devs, far, host_of, hosts, state, per_need) -> Far:
    """The wants `far` per (dst host, tensor), in want order within each, with their shape codes
    (need number and device rank among the group's devices), the same codes with the need's
    position among its tensor's needs, and each group's tensor kind (`Diff.kinds`)."""
    tensors = list(state.tensor_ix)
    key = host_of[devs[far]] * len(tensors) + per_need[of[far], 0]
    order = keysort.argsort(key)
    key, far = key[order], far[order]
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    starts, stops = (np.concatenate(([0], cuts)), np.concatenate((cuts, [len(far)]))) if len(far) else (cuts, cuts)
    need, dev = of[far], devs[far]
    group = np.repeat(np.arange(len(starts)), stops - starts)
    wide = int(dev.max(initial=0)) + 1
    distinct, _, inverse = keysort.unique_first(group * wide + dev)  # by group, then device
    first = np.searchsorted(distinct // wide, distinct // wide)
    rank = (np.arange(len(distinct)) - first)[inverse.reshape(-1)]
    code = need * wide + rank
    ks = key[starts].tolist()
    names = [(hosts[k // len(tensors)], tensors[k % len(tensors)]) for k in ks]
    # a need's position among its tensor's needs (a tensor's needs are one run, `diff`'s order)
    t = per_need[:, 0]
    ts, firsts, _ = keysort.unique_first(t)
    base = np.zeros(len(tensors), I64)
    base[ts] = firsts
    rel = (need - base[t[need]]) * wide + rank
    kind_of = state.p.diff.kinds if state.p.diff is not None else {}
    kinds = [kind_of.get(t, -1) for _, t in names]
    return Far(needs, need, dev, per_need[need, 2], per_need[need, 3], code, starts.tolist(), stops.tolist(), names, rel, kinds)


def _keys(lens: np.ndarray, ints: np.ndarray, ndev: int, host_of: np.ndarray, nhosts: int):
    """Sorted keys set * ndev + device of the first holder per device of each holder set
    (`lens[i]` rows of `ints` each, in turn: device, sub-tensor id, piece; each set sorted, so
    the first per device wins; with its ints) and sorted keys set * nhosts + host. Sets in
    turn, each sorted by device, give both keys in order already (hosts where device numbers
    rise with them, as a topology numbers them), so they are sorted only when they are not."""
    dev = ints[:, 0]
    group = np.repeat(np.arange(len(lens)), lens)
    on_dev, on_host = group * ndev + dev, group * nhosts + host_of[dev]
    if _ascending(on_dev):
        first = keysort.starts(on_dev)
        keys = on_dev[first]
    else:
        keys, first, _ = keysort.unique_first(on_dev)
    return keys, ints[first], on_host[keysort.starts(on_host)] if _ascending(on_host) else keysort.unique(on_host)


def _ascending(keys: np.ndarray) -> bool:
    return bool((keys[1:] >= keys[:-1]).all())


def _with_host_class(state, needs, of, devs, near: np.ndarray, here: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`rows` (the device-class copies of wants `here`) with the host-class copies of wants
    `near` merged in want order; those are chosen one at a time (least-loaded device)."""
    if not len(near):
        return rows
    state.rows, made = [], []
    for i, d in zip(of[near].tolist(), devs[near].tolist()):
        need = needs[i]
        same_host = [h for h in need.holders if state.host[h.device] == state.host[d]]  # sorted
        best = min(same_host, key=lambda h: (state.sent_device[h.device], h))
        state.sent_device[best.device] += need.box.volume * state.size[need.tensor]
        before = len(state.rows)
        state.copy(need, d, best, need.box)
        made.append(len(state.rows) - before)
    wants = np.concatenate((here, np.repeat(near, made)))
    merged = np.concatenate((rows, np.array(state.rows, I64).reshape(-1, 8)))
    state.rows = []
    return merged[keysort.argsort(wants)]
