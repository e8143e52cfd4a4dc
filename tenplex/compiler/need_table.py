"""`NeedTable`: the diff's needs as int columns, put together from its tensor kinds' templates.

The diff puts every tensor's needs from its kind's template (`diff._Kinds`): per need row the
dst sub-tensor's position k among the tensor's, the piece, the box object and the holder
tuple's number in the template; per kind the dst devices of each position. select-sources
read those fields back from 37k `Need` objects (eight walks at 1024 GPUs); here the same
columns come out of numpy from the 170 templates and, per tensor, its kind and its dst
sub-tensors' numbers.

Invariants: rows are in the diff's need order (tensors in dst order, each its template's rows
in order); box numbers are given in order of first appearance among the needs (a box object
first appears in the tensor that made its template, which comes first); holder sets are
(`HolderSets` template number, tensor number).
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter

import attrs
import numpy as np

from tenplex.compiler import keysort
from tenplex.ir.box import Box

I64 = np.int64
_FIRST, _SECOND, _THIRD, _FOURTH = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)


@attrs.frozen
class NeedColumns:
    """One row per need: `tensor` (its dst tensor's position), `box` (a number into
    `NeedTable.boxes`), `dst` (its dst sub-tensor's position in the dst PTC), `piece`, holder
    set (`set_g`, `set_t`: template and tensor numbers of `HolderSets`), and its `count` dst
    devices, in turn in `devices`."""

    tensor: np.ndarray
    box: np.ndarray
    dst: np.ndarray
    piece: np.ndarray
    set_g: np.ndarray
    set_t: np.ndarray
    count: np.ndarray
    devices: np.ndarray


class NeedTable:
    """Kinds (template rows (k, piece, box, holder number), dst devices per position k, first
    `HolderSets` template number) and tensors (kind, dst sub-tensor numbers), in the order the
    diff adds them."""

    def __init__(self) -> None:
        self.kinds: list[tuple[list, tuple, int]] = []
        self.tensors: list[tuple[int, tuple[int, ...]]] = []
        self.boxes: list[Box] = []
        self._box_of: dict[int, int] = {}

    def add_kind(self, rows: list[tuple[int, int, Box, int]], devices: tuple[tuple[int, ...], ...], first_set: int) -> None:
        for _, _, box, _ in rows:
            if id(box) not in self._box_of:
                self._box_of[id(box)] = len(self.boxes)
                self.boxes.append(box)  # keeps it alive for id()
        self.kinds.append(([(k, j, self._box_of[id(b)], h) for k, j, b, h in rows], devices, first_set))

    def add_tensor(self, kind: int, dst_numbers: tuple[int, ...]) -> None:
        self.tensors.append((kind, dst_numbers))

    def columns(self) -> NeedColumns:
        kinds = self.kinds
        rows = [r for r, _, _ in kinds]
        klen = np.fromiter(map(len, rows), I64, len(rows))
        flat = list(chain.from_iterable(rows))
        rk, rj, rbox, rh = (np.fromiter(map(get, flat), I64, len(flat)) for get in (_FIRST, _SECOND, _THIRD, _FOURTH))
        # per kind, its dst positions' devices: a slot per (kind, k)
        slots = [devs for _, ds, _ in kinds for devs in ds]
        slot_len = np.fromiter(map(len, slots), I64, len(slots))
        dev_flat = np.fromiter(chain.from_iterable(slots), I64, int(slot_len.sum()))
        kslots = np.fromiter((len(ds) for _, ds, _ in kinds), I64, len(kinds))
        kslot_off, slot_start = np.cumsum(kslots) - kslots, np.cumsum(slot_len) - slot_len
        first_set = np.fromiter((f for *_, f in kinds), I64, len(kinds))
        kind = np.fromiter(map(_FIRST, self.tensors), I64, len(self.tensors))
        dlen = np.fromiter((len(d) for _, d in self.tensors), I64, len(self.tensors))
        dnum = np.fromiter(chain.from_iterable(map(_SECOND, self.tensors)), I64, int(dlen.sum()))
        nrows = klen[kind]
        inst = np.repeat(np.arange(len(kind)), nrows)
        idx = keysort.ranges(np.cumsum(klen)[kind] - nrows, nrows)
        k = rk[idx]
        slot = kslot_off[kind[inst]] + k
        count = slot_len[slot]
        return NeedColumns(inst, rbox[idx], dnum[(np.cumsum(dlen) - dlen)[inst] + k], rj[idx], first_set[kind[inst]] + rh[idx],
                           inst, count, dev_flat[keysort.ranges(slot_start[slot], count)])  # fmt: skip
