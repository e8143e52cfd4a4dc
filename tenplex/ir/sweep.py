"""Sweep-line intersection of box lists, shared by the compiler and the checker.

Boxes are swept along dimension 0 (sorted by start); a pair is reported when the boxes overlap
in every dimension. Cost O(n log n + pairs overlapping in dim 0), never all-pairs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tenplex.ir.box import Box


def overlapping_pairs(a: Sequence[Box], b: Sequence[Box]) -> Iterator[tuple[int, int]]:
    """Index pairs (i, j) with a[i] and b[j] overlapping, in a deterministic order."""
    if not a or not b:
        return
    if a[0].ndim == 0 or len(a) * len(b) <= 16:
        yield from ((i, j) for j, y in enumerate(b) for i, x in enumerate(a) if x.overlaps(y))
        return
    events = sorted(
        [(box.start[0], 0, i) for i, box in enumerate(a) if not box.empty]
        + [(box.start[0], 1, j) for j, box in enumerate(b) if not box.empty]
    )
    active: tuple[list[int], list[int]] = ([], [])
    boxes = (a, b)
    for pos, side, idx in events:
        other = 1 - side
        active[other][:] = [k for k in active[other] if boxes[other][k].stop[0] > pos]
        box = boxes[side][idx]
        for k in active[other]:
            if box.overlaps(boxes[other][k]):
                yield (idx, k) if side == 0 else (k, idx)
        active[side].append(idx)
