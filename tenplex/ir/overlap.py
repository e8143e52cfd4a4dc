"""Regions of a tensor that a PTC holds more than once.

A PTC may hold an element of a tensor in several places, and legitimately: Megatron keeps a
norm or bias whole on every TP rank (one sub-tensor per rank, equal boxes), ties the embedding
to a second holder on the last stage, and a sub-tensor may hold one region in two pieces.
Sub-tensors whose boxes *overlap without being equal* are rarer: two holders that split the
tensor differently (a checkpoint stitched from two layouts, or a broken one). Neither is an
error of the IR; both deserve a word when a person inspects the PTC (`describe`).
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from tenplex.ir.box import Box, disjoint_union
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs


@attrs.frozen
class Overlap:
    """Two held global boxes of one tensor that share elements but differ."""

    tensor: str
    a: tuple[str, Box]  # (sub-tensor id, global box)
    b: tuple[str, Box]

    @property
    def common(self) -> Box:
        common = self.a[1].intersect(self.b[1])
        assert common is not None  # overlapping by construction
        return common


def overlaps(ptc: PTC, limit: int = 4) -> dict[str, list[Overlap]]:
    """Per tensor, up to `limit` pairs of held boxes that overlap without being equal (each box
    named by its first holder), found by sweep-line over the distinct boxes."""
    out = {}
    for meta in ptc.tensors:
        holder: dict[Box, str] = {}
        for st in ptc.by_tensor[meta.name]:
            for p in st.pieces:
                holder.setdefault(p.global_box, st.id)
        boxes = sorted(holder)
        found = []
        for i, j in overlapping_pairs(boxes, boxes):
            if i < j:
                found.append(Overlap(meta.name, (holder[boxes[i]], boxes[i]), (holder[boxes[j]], boxes[j])))
                if len(found) == limit:
                    break
        if found:
            out[meta.name] = found
    return out


def extra_elements(ptc: PTC) -> dict[str, int]:
    """Per tensor held more than once: the elements held beyond one copy (every piece of every
    sub-tensor counted, DP replicas of a partition not)."""
    held: dict[str, list[Box]] = defaultdict(list)
    for st in ptc.subtensors:
        held[st.tensor].extend(p.global_box for p in st.pieces)
    out = {}
    for name, boxes in held.items():
        extra = sum(b.volume for b in boxes) - sum(b.volume for b in disjoint_union(boxes))
        if extra:
            out[name] = extra
    return out
