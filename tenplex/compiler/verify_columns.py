"""`accepts`: `check_plan`'s checks on the plan's copies and messages as numpy columns.

A large plan is mostly copy ops and messages (424k and 215k for GPT-3 175B at 1024 GPUs);
checking them one Python object at a time costs seconds. Here their fields become int64 columns
(sub-tensor ids, tensors and hosts interned to ints, boxes padded to the largest ndim with [0, 1)
extents) and every check of `verify._Checker` on them runs as array operations; the few fill and
value ops, the fill regions and the stats' lower bound go through the checker's own methods.

`accepts` is a sufficient condition: True only when each check of the exact checker holds
(the same ownership, containment, exact cover, forwarding, message, budget and stats checks,
in other words). Anything it cannot show (a failed check, a group of boxes that one sweep along
a single dimension does not prove disjoint and the exact sweep refuses, a number past int64)
makes it return False, and `check_plan` runs the exact checker, which names the first broken
thing. So a plan verifies here exactly when it verifies there, and errors read the same.
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from tenplex.compiler.cost import host_lower_bounds, lower_bound_seconds
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.ir.box import Box
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs

I64 = np.int64
_KIND = {CopyOp: 0, FillOp: 1, ValueOp: 2}
_SIDE = {"src": 0, "dst": 1}
_ID, _TENSOR, _PIECES, _OPS = attrgetter("id"), attrgetter("tensor"), attrgetter("pieces"), attrgetter("ops")
_MAX_ROUND = 1 << 31  # larger rounds go to the exact checker (keeps the group keys in int64)
_MAX_DEVICES = 1 << 24  # so do device ids past this


class _Reject(Exception):
    """A check failed or cannot be shown here: the exact checker decides."""


def _need(ok: Any) -> None:
    if not (ok if type(ok) is bool else ok.all()):
        raise _Reject


def _ints(values, n: int) -> np.ndarray:
    return np.fromiter(values, I64, n)  # OverflowError past int64, TypeError for junk


def _pad(boxes: list[Box], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, stops, ndims): (n, k) arrays, dims past a box's ndim set to [0, 1)."""
    starts, stops = list(map(attrgetter("start"), boxes)), list(map(attrgetter("stop"), boxes))
    nd = _ints(map(len, starts), len(boxes))
    _need(nd <= k)
    total = int(nd.sum())
    rows = np.repeat(np.arange(len(boxes)), nd)
    cols = np.arange(total) - np.repeat(np.cumsum(nd) - nd, nd)
    lo, hi = np.zeros((len(boxes), k), I64), np.ones((len(boxes), k), I64)
    lo[rows, cols] = _ints(chain.from_iterable(starts), total)
    hi[rows, cols] = _ints(chain.from_iterable(stops), total)
    return lo, hi, nd


def _member(sorted_keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    pos = np.minimum(np.searchsorted(sorted_keys, q), max(len(sorted_keys) - 1, 0))
    return sorted_keys[pos] == q if len(sorted_keys) else np.zeros(len(q), bool)


def _group_sum(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (sorted) and the int64 sum of `values` per key."""
    if not len(keys):
        return keys, values
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.concatenate(([0], np.flatnonzero(k[1:] != k[:-1]) + 1))
    return k[starts], np.add.reduceat(values[order], starts)


class _Side:
    """One PTC's sub-tensors as arrays indexed by the shared sub-tensor index: tensor index,
    piece count and first row in a piece table of global boxes; `held`: sorted keys
    sid * ndev + device of the sub-tensors each device holds."""

    def __init__(self, ptc: PTC, sid_ix: dict[str, int], tensor_ix: dict[str, int], ndev: int, k: int):
        n = len(sid_ix)
        self.tensor, self.npieces = np.full(n, -1, I64), np.zeros(n, I64)
        sts = ptc.subtensors
        at = _ints(map(sid_ix.__getitem__, map(_ID, sts)), len(sts))
        self.tensor[at] = _ints(map(tensor_ix.get, map(_TENSOR, sts), repeat(-1)), len(sts))
        self.npieces[at] = _ints(map(len, map(_PIECES, sts)), len(sts))
        self.base = np.zeros(n, I64)
        self.base[at] = np.cumsum(self.npieces[at]) - self.npieces[at]
        self.lo, self.hi, _ = _pad([p.global_box for st in sts for p in st.pieces], k)
        held_volume = np.concatenate(([0], np.cumsum(np.prod(self.hi - self.lo, axis=1))))
        self.gap = np.zeros(n, I64)  # elements outside the pieces (local and global volumes agree)
        self.gap[at] = _ints((st.volume for st in sts), len(sts)) - (
            held_volume[self.base[at] + self.npieces[at]] - held_volume[self.base[at]]
        )
        held = [np.add.outer(_ints((sid_ix[s] for s in ptc.partition_map[pid].subtensors), -1) * ndev, np.array(devs, I64)).ravel()
                for pid, devs in ptc.allocation.items]  # fmt: skip
        self.held = np.sort(np.concatenate(held)) if held else np.zeros(0, I64)

    def rows(self, sid: np.ndarray, dev: np.ndarray, piece: np.ndarray, ndev: int) -> np.ndarray:
        """Piece-table rows of (sub-tensor, device, piece) triples, each of which the device holds."""
        _need((sid >= 0) & (dev >= 0) & (dev < ndev) & (piece >= 0))
        _need(_member(self.held, sid * ndev + dev) & (piece < self.npieces[sid]))
        return self.base[sid] + piece


class _Copies:
    """The plan's copy ops as columns (`at`: their op ids)."""

    def __init__(self, ops: tuple, at: np.ndarray, sid_ix: dict[str, int], tensor_ix: dict[str, int], k: int):
        copies = [ops[i] for i in at.tolist()]
        n = len(copies)

        def col(name: str, intern: dict[str, int] | None = None) -> np.ndarray:
            values = map(attrgetter(name), copies)
            return _ints(values if intern is None else map(intern.get, values, repeat(-1)), n)

        self.at, self.tensor = at, col("tensor", tensor_ix)
        self.src_dev, self.src_sid, self.src_piece = col("src_device"), col("src_subtensor", sid_ix), col("src_piece")
        self.dst_dev, self.dst_sid, self.dst_piece = col("dst_device"), col("dst_subtensor", sid_ix), col("dst_piece")
        side = col("src_side", _SIDE)
        _need(side >= 0)
        self.forward = side == 1
        self.lo, self.hi, self.nd = _pad(list(map(attrgetter("box"), copies)), k)
        self.volume = np.prod(self.hi - self.lo, axis=1)


def _contains(lo, hi, plo, phi) -> np.ndarray:
    return np.all((lo >= plo) & (hi <= phi), axis=1)


class _Columns:
    """The checks of `verify._Checker` on columns; each method raises _Reject where it fails."""

    def __init__(self, c: Any):
        self.c, plan, src, dst = c, c.plan, c.src, c.dst
        self.n = len(plan.ops)
        kind = _ints(map(_KIND.__getitem__, map(type, plan.ops)), self.n)  # KeyError: another type
        self.kind = kind
        devices = [d.id for d in c.topology.devices]
        _need(np.array(devices, I64) >= 0)
        self.ndev = max(devices, default=-1) + 1
        _need(self.ndev <= _MAX_DEVICES)  # device-indexed tables stay small; key products stay in int64
        names = [t.name for t in dst.tensors]
        self.tensor_ix = {t: i for i, t in enumerate(names)}
        self.ndim = _ints((len(t.shape) for t in dst.tensors), len(names))
        self.itemsize = _ints((dst.itemsizes[t] for t in names), len(names))
        k = max(int(self.ndim.max(initial=0)), 1)
        sids = dict.fromkeys(chain((s.id for s in src.subtensors), (s.id for s in dst.subtensors)))
        self.sid_ix = {s: i for i, s in enumerate(sids)}
        self.src = _Side(src, self.sid_ix, self.tensor_ix, self.ndev, k)
        self.dst = _Side(dst, self.sid_ix, self.tensor_ix, self.ndev, k)
        self.cp = _Copies(plan.ops, np.flatnonzero(kind == 0), self.sid_ix, self.tensor_ix, k)
        self.hosts = {h: i for i, h in enumerate(c.topology.hosts)}
        self.host_of = np.full(self.ndev, -1, I64)
        self.host_of[np.array(devices, I64)] = _ints((self.hosts[d.host] for d in c.topology.devices), len(devices))
        self.bytes = self.cp.volume * self.itemsize[np.maximum(self.cp.tensor, 0)]

    def copies(self) -> None:
        """Each copy writes inside a dst piece its device holds and reads inside a piece of its
        source side that its device holds, all of one tensor, with the tensor's ndim."""
        cp, nd = self.cp, self.ndev
        self.wrow = self.dst.rows(cp.dst_sid, cp.dst_dev, cp.dst_piece, nd)
        _need((self.dst.tensor[cp.dst_sid] == cp.tensor) & (cp.nd == self.ndim[cp.tensor]))
        _need(_contains(cp.lo, cp.hi, self.dst.lo[self.wrow], self.dst.hi[self.wrow]))
        for side, mask in ((self.src, ~cp.forward), (self.dst, cp.forward)):
            rows = side.rows(cp.src_sid[mask], cp.src_dev[mask], cp.src_piece[mask], nd)
            _need(side.tensor[cp.src_sid[mask]] == cp.tensor[mask])
            _need(_contains(cp.lo[mask], cp.hi[mask], side.lo[rows], side.hi[rows]))
        src_map, dst_map = self.c.src.tensor_map, self.c.dst.tensor_map
        names = list(self.tensor_ix)
        for t in np.unique(cp.tensor[~cp.forward]).tolist():
            _need(src_map.get(names[t]) == dst_map[names[t]])

    def messages(self) -> None:
        """Each copy is in one message, between its devices' hosts; the bytes add up; sizes
        and per-host network bytes per round stay within the options."""
        plan, cp = self.c.plan, self.cp
        ms = plan.messages
        m = len(ms)
        self.m_round = _ints(map(attrgetter("round"), ms), m)
        _need((self.m_round >= 0) & (self.m_round < _MAX_ROUND))
        m_bytes = _ints(map(attrgetter("bytes"), ms), m)
        lens = _ints(map(len, map(_OPS, ms)), m)
        flat = _ints(chain.from_iterable(map(attrgetter("ops"), ms)), int(lens.sum()))
        _need((flat >= 0) & (flat < self.n))
        _need(self.kind[flat] == 0)
        _need(np.bincount(flat, minlength=self.n)[cp.at] == 1)
        pos = np.full(self.n, -1, I64)
        pos[cp.at] = np.arange(len(cp.at))
        of = pos[flat]  # copy position of each listed op
        hs = _ints(map(self.hosts.get, map(attrgetter("src_host"), ms), repeat(-1)), m)
        hd = _ints(map(self.hosts.get, map(attrgetter("dst_host"), ms), repeat(-1)), m)
        _need(
            (np.repeat(hs, lens) == self.host_of[cp.src_dev[of]])
            & (np.repeat(hd, lens) == self.host_of[cp.dst_dev[of]])
        )
        sums = np.concatenate(([0], np.cumsum(self.bytes[of])))
        ends = np.cumsum(lens)
        _need(sums[ends] - sums[ends - lens] == m_bytes)
        big = np.flatnonzero(m_bytes > plan.options.max_message_bytes)
        _need(lens[big] == 1)
        first = of[(ends - lens)[big]]
        _need((cp.src_dev[first] == cp.dst_dev[first]) | (cp.volume[first] == 1))
        net = hs != hd
        keys = np.concatenate(
            (self.m_round[net] * len(self.hosts) + hs[net], self.m_round[net] * len(self.hosts) + hd[net])
        )
        _need(_group_sum(keys, np.concatenate((m_bytes[net], m_bytes[net])))[1] <= plan.options.memory_budget_bytes)
        self.round = np.zeros(self.n, I64)
        self.round[flat] = np.repeat(self.m_round, lens)
        self.msg = (hs, hd, m_bytes, lens, of)

    def edges(self) -> None:
        """Order edges go to a later round; each forward copy has an order-edge predecessor in an
        earlier round that wrote a box containing its own into the piece it reads."""
        e = np.array(self.c.plan.edges, I64).reshape(-1, 2)
        a, b = e[:, 0], e[:, 1]
        _need((a >= 0) & (a < self.n) & (b >= 0) & (b < self.n))
        _need(self.round[a] < self.round[b])
        cp = self.cp
        fwd = cp.at[cp.forward]
        if not len(fwd):
            return
        pos = np.full(self.n, -1, I64)
        pos[cp.at] = np.arange(len(cp.at))
        pa, pb = pos[a], pos[b]
        keep = (pa >= 0) & (pb >= 0)
        pa, pb = pa[keep], pb[keep]
        wrote = (
            (cp.dst_sid[pa] == cp.src_sid[pb])
            & (cp.dst_dev[pa] == cp.src_dev[pb])
            & (cp.dst_piece[pa] == cp.src_piece[pb])
        )
        wrote &= _contains(cp.lo[pb], cp.hi[pb], cp.lo[pa], cp.hi[pa])
        ok = np.zeros(self.n, bool)
        ok[cp.at[pb[wrote]]] = True
        _need(ok[fwd])

    def cover(self) -> None:
        """Each dst piece on each device holding it is written by disjoint copies whose volumes
        add up to the piece's."""
        cp, dst, nd = self.cp, self.dst, self.ndev
        k = dst.held // nd
        reps = dst.npieces[k]
        rows = np.repeat(dst.base[k], reps) + np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        need = rows * nd + np.repeat(dst.held % nd, reps)
        vol = np.prod(dst.hi[rows] - dst.lo[rows], axis=1)
        need, vol = need[vol > 0], vol[vol > 0]
        order = np.argsort(need)
        key = self.wrow * nd + cp.dst_dev
        got, sums = _group_sum(key, cp.volume)
        _need(len(got) == len(need))
        _need((got == need[order]) & (sums == vol[order]))
        self.disjoint(key)

    def disjoint(self, key: np.ndarray) -> None:
        """Copies into one piece on one device are pairwise disjoint: a group sorted along one
        dimension, each box stopping where the next starts or before, is; groups that no one
        dimension separates go through the exact sweep."""
        ks = np.sort(key)
        twice = np.unique(ks[1:][ks[1:] == ks[:-1]])
        if not len(twice):
            return
        sub = np.flatnonzero(np.isin(key, twice))
        kk, lo, hi = key[sub], self.cp.lo[sub], self.cp.hi[sub]
        unproven = twice
        for d in range(lo.shape[1]):
            o = np.lexsort((lo[:, d], kk))
            g = kk[o]
            clash = (g[1:] == g[:-1]) & (hi[o][:-1, d] > lo[o][1:, d])
            unproven = np.intersect1d(unproven, g[1:][clash])
        ops = self.c.plan.ops
        for group in unproven.tolist():
            boxes = [ops[i].box for i in self.cp.at[sub[kk == group]].tolist()]
            _need(not any(a < b for a, b in overlapping_pairs(boxes, boxes)))

    def others(self) -> None:
        """The fill and value ops, through the exact checker's own methods."""
        c, ops = self.c, self.c.plan.ops
        at = np.flatnonzero(self.kind != 0).tolist()
        for i in at:
            if type(ops[i]) is FillOp:
                c.fill(i, ops[i])
        c.values((i, ops[i]) for i in at)
        names = list(self.sid_ix)
        for sid in {names[k] for k in np.flatnonzero(self.dst.gap).tolist()} | {sid for sid, _ in c.fills}:
            st = c.dst.subtensor_map[sid]
            pieces = [p.local_box for p in st.pieces]
            gap = st.volume - sum(b.volume for b in pieces)
            for d in c.dst.devices_of_subtensor(sid):
                c.cover_fills(st, d, pieces, gap)

    def stats(self) -> None:
        """Every stat is the one recomputed from the columns (the cost model's sums, alike)."""
        c, cp, s = self.c, self.cp, self.c.plan.stats
        same_dev = cp.src_dev == cp.dst_dev
        same_host = self.host_of[cp.src_dev] == self.host_of[cp.dst_dev]
        moved = tuple(int(self.bytes[m].sum()) for m in (same_dev, ~same_dev & same_host, ~same_host))
        fills = [op for op in c.plan.ops if type(op) is FillOp] if c.fills else []
        fill = sum(op.box.volume * c.dst.itemsize(c.dst.subtensor_map[op.dst_subtensor].tensor) for op in fills)
        _need(s.fill_bytes == fill and moved == (s.device_bytes, s.host_bytes, s.network_bytes))
        rounds = np.unique(self.m_round)
        _need(s.rounds == len(rounds))
        per_host = host_lower_bounds(c.src, c.dst)
        bound = sum(per_host.values())
        _need(s.network_lower_bound_bytes == bound and s.network_bytes >= bound)
        seconds = (self.predicted(rounds), lower_bound_seconds(per_host, c.topology))
        _need((s.predicted_seconds, s.lower_bound_seconds) == seconds)

    def predicted(self, rounds: np.ndarray) -> float:
        """`cost.predict_seconds` of `cost.round_loads`: per round, the slowest link end's
        bytes / bandwidth (NIC out and in per host, device or host link per dst device)."""
        hs, hd, m_bytes, lens, of = self.msg
        cp, links = self.cp, self.c.topology.links
        w = max(len(self.hosts), self.ndev, 1)
        net = hs != hd
        local = np.repeat(~net, lens)
        ops, r = of[local], np.repeat(self.m_round, lens)[local]
        link = np.where(cp.src_dev[ops] == cp.dst_dev[ops], 2, 3)
        rn = self.m_round[net] * 4
        keys = np.concatenate((rn * w + hs[net], (rn + 1) * w + hd[net], (r * 4 + link) * w + cp.dst_dev[ops]))
        uk, sums = _group_sum(keys, np.concatenate((m_bytes[net], m_bytes[net], self.bytes[ops])))
        bw = np.array([links.network, links.network, links.device, links.host], np.float64)
        t = sums / bw[(uk // w) % 4]
        ur = uk // (4 * w)
        starts = np.concatenate(([0], np.flatnonzero(ur[1:] != ur[:-1]) + 1)) if len(ur) else ur
        slowest = dict(zip(ur[starts].tolist(), np.maximum.reduceat(t, starts).tolist())) if len(ur) else {}
        return sum(slowest.get(x, 0.0) for x in rounds.tolist())


def accepts(checker: Any) -> bool:
    """True when every check of `checker` (a fresh `verify._Checker`) holds on its plan; False
    when one fails or cannot be shown here (then the exact checker decides)."""
    try:
        cols = _Columns(checker)
        cols.copies()
        cols.messages()
        cols.edges()
        cols.cover()
        cols.others()
        cols.stats()
    except (_Reject, TenplexError, KeyError, IndexError, TypeError, ValueError, OverflowError):
        return False
    return True
