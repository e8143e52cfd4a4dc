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

import attrs

from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import SubTensor

Codes = tuple[int, ...]  # a sub-tensor's piece boxes by number, in piece order


@attrs.frozen
class PTCPieces:
    """One PTC's sub-tensors by tensor (their ids, partition ids and codes, in sub-tensor
    order), by partition ((tensor, codes) rows), and their ids in the PTC's order (`ids`),
    with each tensor's sub-tensors' positions in it (`numbers`)."""

    tensors: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[Codes, ...]]]
    partitions: dict[str, list[tuple[str, Codes]]]
    ids: tuple[str, ...] = ()
    numbers: dict[str, tuple[int, ...]] = attrs.field(factory=dict)


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
    out = []
    for p in st.pieces:
        g = p.global_box
        k = number.get((g.start, g.stop))
        if k is None:
            k = number[g.start, g.stop] = len(boxes)
            boxes.append(g)
        out.append(k)
    return tuple(out)


def _read(ptc: PTC, number: dict[tuple, int], boxes: list[Box]) -> PTCPieces:
    ids: dict[str, list[str]] = {t.name: [] for t in ptc.tensors}
    pids: dict[str, list[str]] = {t.name: [] for t in ptc.tensors}
    codes: dict[str, list[Codes]] = {t.name: [] for t in ptc.tensors}
    numbers: dict[str, list[int]] = {t.name: [] for t in ptc.tensors}
    partitions: dict[str, list[tuple[str, Codes]]] = {p.id: [] for p in ptc.partitions}
    partition_of = ptc.partition_of
    everyone = []
    for j, st in enumerate(ptc.subtensors):
        c = codes_of(st, number, boxes)
        sid, tensor = st.id, st.tensor
        pid = partition_of[sid]
        everyone.append(sid)
        ids[tensor].append(sid)
        numbers[tensor].append(j)
        pids[tensor].append(pid)
        codes[tensor].append(c)
        partitions[pid].append((tensor, c))
    tensors = {t: (tuple(ids[t]), tuple(pids[t]), tuple(codes[t])) for t in pids}
    return PTCPieces(tensors, partitions, tuple(everyone), {t: tuple(ns) for t, ns in numbers.items()})
