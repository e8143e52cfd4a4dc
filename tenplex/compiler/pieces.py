"""`Pieces`: the global piece boxes of two PTCs' sub-tensors, read once and numbered by value.

place-ranks (overlaps per box, peer layouts), the lower bound (boxes per partition set) and
the diff (tensor kinds) all key their work by sub-tensors' global boxes. Each read of a 175B
PTC's 37k sub-tensors walked objects spread over the heap and hashed `Box`es (a Python
`__hash__`), ~0.04 CPU s per read on the shared VM, five reads per compile. Here both PTCs are
read once: every distinct global box (by its coordinates, hashed in C) gets a number shared by
src and dst, each sub-tensor the tuple of its pieces' numbers (its *codes*).

Invariants: two boxes have one number iff their starts and stops are equal, and
`boxes[k]` has number k; the rows of a tensor (`PTCPieces.tensors`) and of a partition
(`PTCPieces.partitions`) follow the PTC's sub-tensor order. Nothing here depends on the
allocation, so a PTC's `with_allocation` copy has the same pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import attrs
import numpy as np

from tenplex.compiler import keysort
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import SubTensor

Codes = tuple[int, ...]  # a sub-tensor's piece boxes by number, in piece order


@attrs.frozen
class PTCPieces:
    """One PTC's sub-tensors by tensor (their ids, partition ids and codes, in sub-tensor
    order), by partition ((tensor, codes) rows), and their ids and partition ids in the PTC's
    order (`ids`, `pids`), with each tensor's sub-tensors' positions in it (`numbers`)."""

    tensors: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[Codes, ...]]]
    partitions: dict[str, list[tuple[str, Codes]]]
    ids: tuple[str, ...] = ()
    numbers: dict[str, tuple[int, ...]] = attrs.field(factory=dict)
    pids: tuple[str, ...] = ()  # each sub-tensor's partition id, in the PTC's order


@attrs.frozen
class Pieces:
    boxes: list[Box]  # number -> box
    src: PTCPieces
    dst: PTCPieces

    @classmethod
    def read(cls, src: PTC, dst: PTC) -> Pieces:
        number: dict[tuple, int] = {}
        boxes: list[Box] = []
        return cls(boxes, _read(src, number, boxes), _read(dst, number, boxes))


def codes_of(st: SubTensor, number: dict[tuple, int], boxes: list[Box]) -> Codes:
    """The numbers of `st`'s piece boxes, numbering a box not seen before (appended to `boxes`).
    Keyed by coordinates: hashed in C, where a `Box` calls Python."""
    return tuple([_number(p.global_box, number, boxes) for p in st.pieces])


def _number(g: Box, number: dict[tuple, int], boxes: list[Box]) -> int:
    k = number.get((g.start, g.stop))
    if k is None:
        k = number[g.start, g.stop] = len(boxes)
        boxes.append(g)
    return k


def _grouped(keys: list[str], names: list[str], columns: tuple[Sequence, ...]) -> dict[str, list[tuple]]:
    """name -> each column's rows whose key is that name, in row order (every name of `names`,
    in their order; each key is one of them): one stable sort of the keys' numbers, then slices."""
    index = {name: i for i, name in enumerate(names)}
    k = np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))
    order = keysort.argsort(k).tolist()
    bounds = np.cumsum(np.bincount(k, minlength=len(names))).tolist()
    pick = itemgetter(*order) if len(order) > 1 else lambda c: tuple(c[i] for i in order)
    cols = [pick(c) for c in columns]
    out, a = {}, 0
    for name, b in zip(names, bounds):
        out[name] = [c[a:b] for c in cols]
        a = b
    return out


def _read(ptc: PTC, number: dict[tuple, int], boxes: list[Box]) -> PTCPieces:
    """Column by column: the frontends share one pieces tuple between the sub-tensors of one
    layout (72 of 37k at 175B), so codes are worked out once per tuple (by `id`: the PTC keeps
    them alive), and the per-tensor and per-partition rows are gathered by one sort each."""
    sts = ptc.subtensors
    ids = [st.id for st in sts]
    tensor_of = [st.tensor for st in sts]
    memo: dict[int, Codes] = {}
    codes = []
    for ps in [st.pieces for st in sts]:
        c = memo.get(id(ps))
        if c is None:
            c = memo[id(ps)] = tuple([_number(p.global_box, number, boxes) for p in ps])
        codes.append(c)
    pids = list(map(ptc.partition_of.__getitem__, ids))
    by_tensor = _grouped(tensor_of, [t.name for t in ptc.tensors], (ids, pids, codes, range(len(ids))))
    by_partition = _grouped(pids, [p.id for p in ptc.partitions], (list(zip(tensor_of, codes)),))
    return PTCPieces(
        {t: (a, b, c) for t, (a, b, c, _) in by_tensor.items()},
        {pid: list(rows) for pid, (rows,) in by_partition.items()},
        tuple(ids),
        {t: js for t, (*_, js) in by_tensor.items()},
        tuple(pids),
    )
