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
thing. So `check_plan` verifies a plan exactly when the exact checker does, and its errors
read the same. The columns themselves are built by `verify.tables`.
"""

from __future__ import annotations

from itertools import chain, repeat
from typing import Any

import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.cost import host_lower_bounds, lower_bound_seconds
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.table import message_table, op_table
from tenplex.compiler.verify.tables import I64, Copies, Reject, Side, contains, group_sum, ints, need
from tenplex.ir.errors import TenplexError
from tenplex.ir.sweep import overlapping_pairs

_KIND = {CopyOp: 0, FillOp: 1, ValueOp: 2}
_MAX_ROUND = 1 << 31  # larger rounds go to the exact checker (keeps the group keys in int64)
_MAX_DEVICES = 1 << 24  # so do device ids past this


class _Columns:
    """The checks of `verify._Checker` on columns; each method raises Reject where it fails."""

    def __init__(self, c: Any):
        self.c, plan, src, dst = c, c.plan, c.src, c.dst
        table = op_table(plan)
        self.n = table.n
        self.few = table.others  # fills and value ops
        kind = np.zeros(self.n, I64)
        kind[np.array([i for i, _ in self.few], I64)] = ints((_KIND[type(op)] for _, op in self.few), len(self.few))
        self.kind = kind  # KeyError above: another type
        devices = [d.id for d in c.topology.devices]
        need(np.array(devices, I64) >= 0)
        self.ndev = max(devices, default=-1) + 1
        need(self.ndev <= _MAX_DEVICES)  # device-indexed tables stay small; key products stay in int64
        names = [t.name for t in dst.tensors]
        self.tensor_ix = {t: i for i, t in enumerate(names)}
        self.ndim = ints((len(t.shape) for t in dst.tensors), len(names))
        self.itemsize = ints((dst.itemsizes[t] for t in names), len(names))
        k = max(int(self.ndim.max(initial=0)), 1)
        sids = dict.fromkeys(chain((s.id for s in src.subtensors), (s.id for s in dst.subtensors)))
        self.sid_ix = {s: i for i, s in enumerate(sids)}
        self.src = Side(src, self.sid_ix, self.tensor_ix, self.ndev, k)
        self.dst = Side(dst, self.sid_ix, self.tensor_ix, self.ndev, k)
        self.cp = Copies(table, self.sid_ix, self.tensor_ix, k)
        self.hosts = {h: i for i, h in enumerate(c.topology.hosts)}
        self.host_of = np.full(self.ndev, -1, I64)
        self.host_of[np.array(devices, I64)] = ints((self.hosts[d.host] for d in c.topology.devices), len(devices))
        self.bytes = self.cp.volume * self.itemsize[np.maximum(self.cp.tensor, 0)]

    def copies(self) -> None:
        """Each copy writes inside a dst piece its device holds and reads inside a piece of its
        source side that its device holds, all of one tensor, with the tensor's ndim."""
        cp, nd = self.cp, self.ndev
        self.wrow = self.dst.rows(cp.dst_sid, cp.dst_dev, cp.dst_piece, nd)
        need((self.dst.tensor[cp.dst_sid] == cp.tensor) & (cp.nd == self.ndim[cp.tensor]))
        need(contains(cp.lo, cp.hi, self.dst.lo[self.wrow], self.dst.hi[self.wrow]))
        for side, mask in ((self.src, ~cp.forward), (self.dst, cp.forward)):
            rows = side.rows(cp.src_sid[mask], cp.src_dev[mask], cp.src_piece[mask], nd)
            need(side.tensor[cp.src_sid[mask]] == cp.tensor[mask])
            need(contains(cp.lo[mask], cp.hi[mask], side.lo[rows], side.hi[rows]))
        src_map, dst_map = self.c.src.tensor_map, self.c.dst.tensor_map
        names = list(self.tensor_ix)
        for t in keysort.unique(cp.tensor[~cp.forward]).tolist():
            need(src_map.get(names[t]) == dst_map[names[t]])

    def messages(self) -> None:
        """Each copy is in one message, between its devices' hosts; the bytes add up; sizes
        and per-host network bytes per round stay within the options."""
        plan, cp = self.c.plan, self.cp
        ms = message_table(plan)
        self.m_round = ms.round
        need((self.m_round >= 0) & (self.m_round < _MAX_ROUND))
        m_bytes, lens, flat = ms.bytes, ms.lens, ms.ops
        need((flat >= 0) & (flat < self.n))
        need(self.kind[flat] == 0)
        need(np.bincount(flat, minlength=self.n)[cp.at] == 1)
        pos = np.full(self.n, -1, I64)
        pos[cp.at] = np.arange(len(cp.at))
        of = pos[flat]  # copy position of each listed op
        host_ix = ints(map(self.hosts.get, ms.hosts, repeat(-1)), len(ms.hosts))
        hs, hd = host_ix[ms.src], host_ix[ms.dst]
        need(
            (np.repeat(hs, lens) == self.host_of[cp.src_dev[of]])
            & (np.repeat(hd, lens) == self.host_of[cp.dst_dev[of]])
        )
        sums = np.concatenate(([0], np.cumsum(self.bytes[of])))
        ends = np.cumsum(lens)
        need(sums[ends] - sums[ends - lens] == m_bytes)
        big = np.flatnonzero(m_bytes > plan.options.max_message_bytes)
        need(lens[big] == 1)
        first = of[(ends - lens)[big]]
        need((cp.src_dev[first] == cp.dst_dev[first]) | (cp.volume[first] == 1))
        net = hs != hd
        keys = np.concatenate(
            (self.m_round[net] * len(self.hosts) + hs[net], self.m_round[net] * len(self.hosts) + hd[net])
        )
        need(group_sum(keys, np.concatenate((m_bytes[net], m_bytes[net])))[1] <= plan.options.memory_budget_bytes)
        self.round = np.zeros(self.n, I64)
        self.round[flat] = np.repeat(self.m_round, lens)
        self.msg = (hs, hd, m_bytes, lens, of)

    def edges(self) -> None:
        """Order edges go to a later round; each forward copy has an order-edge predecessor in an
        earlier round that wrote a box containing its own into the piece it reads."""
        e = np.array(self.c.plan.edges, I64).reshape(-1, 2)
        a, b = e[:, 0], e[:, 1]
        need((a >= 0) & (a < self.n) & (b >= 0) & (b < self.n))
        need(self.round[a] < self.round[b])
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
        wrote &= contains(cp.lo[pb], cp.hi[pb], cp.lo[pa], cp.hi[pa])
        ok = np.zeros(self.n, bool)
        ok[cp.at[pb[wrote]]] = True
        need(ok[fwd])

    def cover(self) -> None:
        """Each dst piece on each device holding it is written by disjoint copies whose volumes
        add up to the piece's."""
        cp, dst, nd = self.cp, self.dst, self.ndev
        k = dst.held // nd
        reps = dst.npieces[k]
        rows = np.repeat(dst.base[k], reps) + np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        wanted = rows * nd + np.repeat(dst.held % nd, reps)
        vol = np.prod(dst.hi[rows] - dst.lo[rows], axis=1)
        wanted, vol = wanted[vol > 0], vol[vol > 0]
        order = keysort.argsort(wanted)
        key = self.wrow * nd + cp.dst_dev
        got, sums = group_sum(key, cp.volume)
        need(len(got) == len(wanted))
        need((got == wanted[order]) & (sums == vol[order]))
        self.disjoint(key)

    def disjoint(self, key: np.ndarray) -> None:
        """Copies into one piece on one device are pairwise disjoint: a group sorted along one
        dimension, each box stopping where the next starts or before, is; groups that no one
        dimension separates go through the exact sweep."""
        ks = np.sort(key)
        twice = keysort.unique(ks[1:][ks[1:] == ks[:-1]])
        if not len(twice):
            return
        sub = np.flatnonzero(keysort.member(twice, key))
        kk, lo, hi = key[sub], self.cp.lo[sub], self.cp.hi[sub]
        unproven = twice
        for d in range(lo.shape[1]):
            o = keysort.lexsort((lo[:, d], kk))
            g = kk[o]
            clash = (g[1:] == g[:-1]) & (hi[o][:-1, d] > lo[o][1:, d])
            unproven = unproven[keysort.member(keysort.unique(g[1:][clash]), unproven)]
        for group in unproven.tolist():
            boxes = self.cp.boxes(sub[kk == group])
            need(not any(a < b for a, b in overlapping_pairs(boxes, boxes)))

    def others(self) -> None:
        """The fill and value ops, through the exact checker's own methods."""
        c = self.c
        for i, op in self.few:
            if type(op) is FillOp:
                c.fill(i, op)
        c.values(self.few)
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
        fills = [op for _, op in self.few if type(op) is FillOp]
        fill = sum(op.box.volume * c.dst.itemsize(c.dst.subtensor_map[op.dst_subtensor].tensor) for op in fills)
        need(s.fill_bytes == fill and moved == (s.device_bytes, s.host_bytes, s.network_bytes))
        rounds = keysort.unique(self.m_round)
        need(s.rounds == len(rounds))
        per_host = host_lower_bounds(c.src, c.dst)
        bound = sum(per_host.values())
        need(s.network_lower_bound_bytes == bound and s.network_bytes >= bound)
        seconds = (self.predicted(rounds), lower_bound_seconds(per_host, c.topology))
        need((s.predicted_seconds, s.lower_bound_seconds) == seconds)

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
        uk, sums = group_sum(keys, np.concatenate((m_bytes[net], m_bytes[net], self.bytes[ops])))
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
    except (Reject, TenplexError, KeyError, IndexError, TypeError, ValueError, OverflowError):
        return False
    return True
