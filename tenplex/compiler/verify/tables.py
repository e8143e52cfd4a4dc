"""Plan ops as numpy columns: the pieces `verify.columns` checks with.

Sub-tensor ids, tensors and hosts become ints (interned through dicts), boxes become (n, k)
int64 arrays of starts and stops padded with `[0, 1)` extents past a box's ndim (so volumes and
containment need no ndim case), and a PTC's sub-tensors become tables indexed by the shared
sub-tensor index. Every conversion refuses what it cannot hold exactly (`Reject`, or numpy's
OverflowError past int64) instead of guessing.
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.table import OpTable
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC

I64 = np.int64
_ID, _TENSOR, _PIECES = attrgetter("id"), attrgetter("tensor"), attrgetter("pieces")


class Reject(Exception):
    """A check failed or cannot be shown here: the exact checker decides."""


def need(ok: Any) -> None:
    """Raise Reject unless `ok` (a bool, or a bool array: every element) holds."""
    if not (ok if type(ok) is bool else ok.all()):
        raise Reject


def ints(values, n: int) -> np.ndarray:
    return np.fromiter(values, I64, n)  # OverflowError past int64, TypeError for junk


def pad(boxes: list[Box], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, stops, ndims): (n, k) arrays, dims past a box's ndim set to [0, 1)."""
    starts, stops = list(map(attrgetter("start"), boxes)), list(map(attrgetter("stop"), boxes))
    nd = ints(map(len, starts), len(boxes))
    need(nd <= k)
    total = int(nd.sum())
    rows = np.repeat(np.arange(len(boxes)), nd)
    cols = np.arange(total) - np.repeat(np.cumsum(nd) - nd, nd)
    lo, hi = np.zeros((len(boxes), k), I64), np.ones((len(boxes), k), I64)
    lo[rows, cols] = ints(chain.from_iterable(starts), total)
    hi[rows, cols] = ints(chain.from_iterable(stops), total)
    return lo, hi, nd


def member(sorted_keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    pos = np.minimum(np.searchsorted(sorted_keys, q), max(len(sorted_keys) - 1, 0))
    return sorted_keys[pos] == q if len(sorted_keys) else np.zeros(len(q), bool)


def group_sum(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (sorted) and the int64 sum of `values` per key."""
    if not len(keys):
        return keys, values
    order = keysort.argsort(keys)
    k = keys[order]
    starts = np.concatenate(([0], np.flatnonzero(k[1:] != k[:-1]) + 1))
    return k[starts], np.add.reduceat(values[order], starts)


class Side:
    """One PTC's sub-tensors as arrays indexed by the shared sub-tensor index: tensor index,
    piece count and first row in a piece table of global boxes; `held`: sorted keys
    sid * ndev + device of the sub-tensors each device holds."""

    def __init__(self, ptc: PTC, sid_ix: dict[str, int], tensor_ix: dict[str, int], ndev: int, k: int):
        n = len(sid_ix)
        self.tensor, self.npieces = np.full(n, -1, I64), np.zeros(n, I64)
        sts = ptc.subtensors
        at = ints(map(sid_ix.__getitem__, map(_ID, sts)), len(sts))
        self.tensor[at] = ints(map(tensor_ix.get, map(_TENSOR, sts), repeat(-1)), len(sts))
        self.npieces[at] = ints(map(len, map(_PIECES, sts)), len(sts))
        self.base = np.zeros(n, I64)
        self.base[at] = np.cumsum(self.npieces[at]) - self.npieces[at]
        self.lo, self.hi, _ = pad([p.global_box for st in sts for p in st.pieces], k)
        held_volume = np.concatenate(([0], np.cumsum(np.prod(self.hi - self.lo, axis=1))))
        self.gap = np.zeros(n, I64)  # elements outside the pieces (local and global volumes agree)
        self.gap[at] = ints((st.volume for st in sts), len(sts)) - (
            held_volume[self.base[at] + self.npieces[at]] - held_volume[self.base[at]]
        )
        held = [np.add.outer(ints((sid_ix[s] for s in ptc.partition_map[pid].subtensors), -1) * ndev, np.array(devs, I64)).ravel()
                for pid, devs in ptc.allocation.items]  # fmt: skip
        self.held = np.sort(np.concatenate(held)) if held else np.zeros(0, I64)

    def rows(self, sid: np.ndarray, dev: np.ndarray, piece: np.ndarray, ndev: int) -> np.ndarray:
        """Piece-table rows of (sub-tensor, device, piece) triples, each of which the device holds."""
        need((sid >= 0) & (dev >= 0) & (dev < ndev) & (piece >= 0))
        need(member(self.held, sid * ndev + dev) & (piece < self.npieces[sid]))
        return self.base[sid] + piece


class Copies:
    """The plan's copy ops as columns (`at`: their op ids), from its `OpTable`, with sub-tensor
    ids and tensors interned as the checker's tables are (-1: unknown) and boxes padded to `k`
    dims (Reject: a box of more)."""

    def __init__(self, table: OpTable, sid_ix: dict[str, int], tensor_ix: dict[str, int], k: int):
        self.table = table
        sids = ints(map(sid_ix.get, table.sids, repeat(-1)), len(table.sids))
        tensors = ints(map(tensor_ix.get, table.tensors, repeat(-1)), len(table.tensors))
        self.at, self.tensor = table.copy_at, tensors[table.tensor]
        self.src_dev, self.src_sid, self.src_piece = table.src_dev, sids[table.src_sid], table.src_piece
        self.dst_dev, self.dst_sid, self.dst_piece = table.dst_dev, sids[table.dst_sid], table.dst_piece
        self.forward = table.forward
        lo, hi, self.nd = table.padded
        need(self.nd <= k)
        lo, hi = lo[:, :k], hi[:, :k]
        if lo.shape[1] < k:
            extra = k - lo.shape[1]
            lo = np.hstack((lo, np.zeros((len(lo), extra), I64)))
            hi = np.hstack((hi, np.ones((len(hi), extra), I64)))
        self.lo, self.hi = lo, hi
        self.volume = np.prod(self.hi - self.lo, axis=1)

    def boxes(self, rows: np.ndarray) -> list[Box]:
        return [self.table.boxes[b] for b in self.table.box[rows].tolist()]


def contains(lo, hi, plo, phi) -> np.ndarray:
    return np.all((lo >= plo) & (hi <= phi), axis=1)
