"""Atoms of `select-sources`: the network regions a dst host needs, cut disjoint, as arrays.

Regions a dst host needs of one tensor from other hosts are cut into disjoint *atoms* (cut to
the message size limit); each atom lists the wants (a need on one dst device) that contain it,
landing first, and its holders by host. Hosts alike (DP replicas of one stage) want the same
needs on their own devices, so their atoms are cut once per distinct shape and differ only in
the wants' devices. `Atoms` keeps every atom as a row of arrays (box, tensor, its wants as a
run of want ids) and emits the copies of all of them as columns once the pass has chosen each
atom's source: the landing copy from the chosen holder, then a forward (`src_side="dst"`, read
from the landing piece behind an order edge) to every other want.
"""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter, itemgetter

import numpy as np

from tenplex.compiler.ops import Holder, Need
from tenplex.ir.box import Box, split_box, subtract_all
from tenplex.ir.sweep import overlapping_pairs

I64 = np.int64
_NEED, _DEVICE = itemgetter(0), itemgetter(1)
_SID, _PIECE = attrgetter("dst_subtensor"), attrgetter("dst_piece")
Want = tuple[Need, int]  # a need on one dst device
Shape = tuple[np.ndarray, np.ndarray, np.ndarray, list]  # box ids, want counts, want positions, holders by host


class Atoms:
    """All atoms, one row each: `box` (a box id of the pass), `tensor`, `count` wants starting
    at `start` in `flat` (want ids: rows of `want_dev`, `want_sid`, `want_piece`), `hosts`."""

    def __init__(self, state, remote: dict[tuple[str, str], list[Want]]):
        self.s = state
        self.shapes: dict[tuple, Shape] = {}
        self.holder_hosts: dict[tuple[int, ...], dict[str, list[Holder]]] = {}
        devs: list[int] = []
        sids: list[int] = []
        pieces: list[int] = []
        parts, hosts = [], []
        sid_ix = state.sid_ix
        for key in sorted(remote):
            wants = remote[key]
            needs, on = list(map(_NEED, wants)), list(map(_DEVICE, wants))
            box, count, pos, by_host = self.shape(wants, needs, on)
            parts.append((box, count, pos + len(devs), state.tensor_ix[key[1]]))
            hosts.extend(by_host)
            devs.extend(on)
            sids.extend(map(sid_ix.__getitem__, map(_SID, needs)))
            pieces.extend(map(_PIECE, needs))
        self.want_dev, self.want_sid, self.want_piece = (np.array(x, I64) for x in (devs, sids, pieces))
        self.box = _cat([p[0] for p in parts])
        self.count = _cat([p[1] for p in parts])
        self.flat = _cat([p[2] for p in parts])
        self.tensor = np.repeat(np.array([p[3] for p in parts], I64), [len(p[0]) for p in parts])
        self.start = np.cumsum(self.count) - self.count
        self.hosts = hosts

    def order(self, volume: np.ndarray, itemsize: np.ndarray, lo: np.ndarray, nd: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Atom rows largest bytes first, then by landing device, box start, box stop (the
        tuples' order: a shorter start that is a prefix sorts first, so dims past a box's
        ndim count as -1). Stable, like Python's sort of the rows in this order."""
        nbytes = volume[self.box] * itemsize[self.tensor]
        starts = np.where(np.arange(lo.shape[1]) < nd[:, None], lo, -1)[self.box]
        stops = hi[self.box]
        keys = [stops[:, j] for j in range(stops.shape[1] - 1, -1, -1)]
        keys += [starts[:, j] for j in range(starts.shape[1] - 1, -1, -1)]
        keys += [self.want_dev[self.flat[self.start]], -nbytes]
        return np.lexsort(keys)

    def shape(self, wants: list[Want], needs: list[Need], devices: list[int]) -> Shape:
        """`cut`'s atoms of `wants` (their `needs` and `devices`), memoized by the wants' needs
        and the order of their devices: box ids, want counts, want positions (into `wants`)
        and holders by host."""
        rank = {d: i for i, d in enumerate(sorted(set(devices)))}
        key = tuple(zip(map(id, needs), map(rank.__getitem__, devices)))  # needs stay alive in the lowered graph
        shape = self.shapes.get(key)
        if shape is None:
            pos = {(id(n), d): i for i, (n, d) in enumerate(wants)}
            atoms = self.cut(wants)
            box = np.array([self.s.box_id(b) for b, _, _ in atoms], I64)
            count = np.array([len(ws) for _, ws, _ in atoms], I64)
            flat = np.array([pos[(id(n), d)] for _, ws, _ in atoms for n, d in ws], I64)
            shape = self.shapes[key] = (box, count, flat, [h for _, _, h in atoms])
        return shape

    def cut(self, wants: list[Want]) -> list[tuple[Box, list[Want], dict[str, list[Holder]]]]:
        """Disjoint regions of one tensor needed on one host, each with the wants containing it
        (landing first) and their holders by host, cut to the message size limit."""
        by_box: dict[Box, list[Want]] = defaultdict(list)
        for w in wants:
            by_box[w[0].box].append(w)
        boxes = list(by_box)
        if len(boxes) > 1 and any(i < j for i, j in overlapping_pairs(boxes, boxes)):
            by_box = _refine(by_box)
        limit = max(1, self.s.p.options.max_message_bytes // self.s.size[wants[0][0].tensor])
        out = []
        for box, ws in by_box.items():
            ws, hosts = sorted(ws, key=_want_order), self.by_host(ws)
            out.extend((chunk, ws, hosts) for chunk in split_box(box, limit))
        return out

    def by_host(self, wants: list[Want]) -> dict[str, list[Holder]]:
        """Holders of all `wants` grouped by host (cached: needs share their holder tuples)."""
        groups = {id(n.holders): n.holders for n, _ in wants}
        key = tuple(sorted(groups))
        if key not in self.holder_hosts:
            out: dict[str, list[Holder]] = defaultdict(list)
            for h in sorted({h for hs in groups.values() for h in hs}):
                out[self.s.host[h.device]].append(h)
            self.holder_hosts[key] = out
        return self.holder_hosts[key]

    def copies(self, order: np.ndarray, first_op: int, holders: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[dict, np.ndarray]:
        """Columns of the copies of the atoms in `order` (op ids from `first_op`) whose landing
        copies read `holders` (device, sub-tensor id, piece per atom in that order), and the
        order edges from each landing copy to its forwards."""
        count = self.count[order]
        total = int(count.sum())
        atom = np.repeat(np.arange(len(order)), count)
        head = np.cumsum(count) - count  # op position of each atom's landing copy
        at = np.arange(total) - head[atom]
        want = self.flat[self.start[order][atom] + at]
        landing = at == 0
        lw = want[head][atom]
        cols = {"tensor": self.tensor[order][atom], "box": self.box[order][atom],
                "src_dev": np.where(landing, holders[0][atom], self.want_dev[lw]),
                "src_sid": np.where(landing, holders[1][atom], self.want_sid[lw]),
                "src_piece": np.where(landing, holders[2][atom], self.want_piece[lw]),
                "dst_dev": self.want_dev[want], "dst_sid": self.want_sid[want], "dst_piece": self.want_piece[want],
                "forward": ~landing}  # fmt: skip
        ids = first_op + np.arange(total)
        return cols, np.stack((first_op + head[atom], ids), axis=1)[~landing]


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, I64)


def _want_order(w: Want) -> tuple:
    return (w[1], w[0].dst_subtensor, w[0].dst_piece)


def _refine(by_box: dict[Box, list[Want]]) -> dict[Box, list[Want]]:
    """Disjoint atoms of overlapping need boxes, each listing every want that contains it."""
    atoms: list[tuple[Box, list[Want]]] = []
    for box, wants in by_box.items():
        rest, refined = [box], []
        for a, aws in atoms:
            inter = a.intersect(box)
            if inter is None:
                refined.append((a, aws))
                continue
            refined.append((inter, aws + wants))
            refined.extend((q, aws) for q in a.subtract(inter))
            rest = subtract_all(rest, inter)
        atoms = refined + [(r, list(wants)) for r in rest]
    return dict(sorted(atoms, key=lambda x: x[0]))
