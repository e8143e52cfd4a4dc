"""Axis-aligned half-open boxes: the index algebra of tenplex.

A `Box` is the set of integer points x with start[d] <= x[d] < stop[d] in every dimension d.
A 0-d box (start == stop == ()) is the single point of a scalar tensor and has volume 1.

Invariants:
- start and stop have the same length (the box's ndim);
- 0 <= start[d] <= stop[d] in every dimension.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

import attrs

from tenplex.ir.errors import IRError


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, bool):
            raise IRError(f"box coordinate {v!r} is not an integer")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise IRError(f"box coordinate {v!r} is not an integer") from None
    return tuple(out)


@attrs.frozen(cache_hash=True)
class Box:
    """A half-open box `[start, stop)` of integer points. Ordered by (start, stop)."""

    start: tuple[int, ...] = attrs.field(converter=_ints)
    stop: tuple[int, ...] = attrs.field(converter=_ints)
    shape: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    volume: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise IRError(f"box with start {list(self.start)} and stop {list(self.stop)} has start of {len(self.start)} dims and stop of {len(self.stop)}")
        for a, b in zip(self.start, self.stop):
            if not 0 <= a <= b:
                raise IRError(f"box {self.to_list()} has an interval [{a}, {b}) that is negative or reversed")
        shape = tuple(b - a for a, b in zip(self.start, self.stop))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "volume", math.prod(shape))

    @classmethod
    def _trusted(cls, start: tuple[int, ...], stop: tuple[int, ...]) -> Box:
        """A box from coordinates already known valid (derived from valid boxes): skips the
        converters and checks on the compiler's hot paths."""
        box = object.__new__(cls)
        shape = tuple(map(operator.sub, stop, start))
        set_start, set_stop, set_shape, set_volume, set_hash = _BOX_SLOTS
        set_start(box, start)
        set_stop(box, stop)
        set_shape(box, shape)
        set_volume(box, math.prod(shape))
        set_hash(box, None)  # attrs' hash cache (cache_hash=True)
        return box

    def __lt__(self, other: Box) -> bool:
        return (self.start, self.stop) < (other.start, other.stop)

    def __le__(self, other: Box) -> bool:
        return (self.start, self.stop) <= (other.start, other.stop)

    @classmethod
    def from_shape(cls, shape: Sequence[int]) -> Box:
        return cls((0,) * len(shape), tuple(shape))

    @classmethod
    def from_list(cls, pairs: Sequence[Sequence[int]]) -> Box:
        """From `[[start, stop], ...]`, the JSON form."""
        for p in pairs:
            if not isinstance(p, (list, tuple)) or len(p) != 2:
                raise IRError(f"box interval {p!r} is not a [start, stop] pair")
        return cls(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))

    def to_list(self) -> list[list[int]]:
        return [[a, b] for a, b in zip(self.start, self.stop)]

    def __str__(self) -> str:
        return str(self.to_list())

    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def empty(self) -> bool:
        return self.volume == 0

    def intersect(self, other: Box) -> Box | None:
        """The common part, or None when it is empty."""
        if not self.overlaps(other):
            return None
        start = tuple(a if a > b else b for a, b in zip(self.start, other.start))
        stop = tuple(a if a < b else b for a, b in zip(self.stop, other.stop))
        return Box._trusted(start, stop)

    def overlap_volume(self, other: Box) -> int:
        """Volume of the intersection, without building it."""
        volume = 1
        for a, b, c, d in zip(self.start, self.stop, other.start, other.stop):
            extent = (b if b < d else d) - (a if a > c else c)
            if extent <= 0:
                return 0
            volume *= extent
        return volume

    def overlaps(self, other: Box) -> bool:
        """True when the boxes share a point (an empty box shares none)."""
        if not self.volume or not other.volume:
            return False
        for a, b, c, d in zip(self.start, self.stop, other.start, other.stop):  # noqa: SIM110 (hot path)
            if a >= d or c >= b:
                return False
        return True

    def contains(self, other: Box) -> bool:
        """True when every point of `other` is in this box (never for another ndim)."""
        if len(self.start) != len(other.start):
            return False
        for a, b, c, d in zip(self.start, self.stop, other.start, other.stop):  # noqa: SIM110 (hot path)
            if c < a or d > b:
                return False
        return True

    def translate(self, offset: Sequence[int]) -> Box:
        start = tuple(a + o for a, o in zip(self.start, offset))
        if min(start, default=0) < 0:
            return Box(start, tuple(b + o for b, o in zip(self.stop, offset)))  # raises
        return Box._trusted(start, tuple(b + o for b, o in zip(self.stop, offset)))

    def relative_to(self, origin: Sequence[int]) -> Box:
        """This box in coordinates whose zero is `origin`."""
        return self.translate(tuple(-o for o in origin))

    def to_slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop))

    def subtract(self, other: Box) -> list[Box]:
        """`self` minus `other` as disjoint boxes (at most 2·ndim), in a fixed order."""
        if not self.overlaps(other):
            return [] if self.empty else [self]
        out = []
        start, stop = list(self.start), list(self.stop)
        for d in range(self.ndim):
            if start[d] < other.start[d]:
                out.append(Box._trusted(tuple(start), tuple(stop[:d] + [other.start[d]] + stop[d + 1 :])))
                start[d] = other.start[d]
            if other.stop[d] < stop[d]:
                out.append(Box._trusted(tuple(start[:d] + [other.stop[d]] + start[d + 1 :]), tuple(stop)))
                stop[d] = other.stop[d]
        return out

    def merge(self, other: Box) -> Box | None:
        """The union when it is itself a box (equal in all dims but one, adjacent in that one)."""
        diff = [d for d in range(self.ndim) if (self.start[d], self.stop[d]) != (other.start[d], other.stop[d])]
        if len(diff) != 1:
            return None
        d = diff[0]
        if self.stop[d] == other.start[d]:
            return Box(self.start, self.stop[:d] + (other.stop[d],) + self.stop[d + 1 :])
        if other.stop[d] == self.start[d]:
            return Box(other.start, other.stop[:d] + (self.stop[d],) + other.stop[d + 1 :])
        return None

    def split(self, dim: int, at: int) -> tuple[Box, Box]:
        """Two boxes cut at coordinate `at` of dimension `dim`."""
        if not self.start[dim] < at < self.stop[dim]:
            raise IRError(f"cannot split box {self} at {at} in dim {dim}")
        lo = Box(self.start, self.stop[:dim] + (at,) + self.stop[dim + 1 :])
        hi = Box(self.start[:dim] + (at,) + self.start[dim + 1 :], self.stop)
        return lo, hi


# slot setters of `Box._trusted` (attrs' hash cache last)
_BOX_SLOTS = tuple(Box.__dict__[n].__set__ for n in ("start", "stop", "shape", "volume", "_attrs_cached_hash"))


def subtract_all(boxes: Iterable[Box], cut: Box) -> list[Box]:
    """Every box minus `cut`, as disjoint boxes."""
    return [part for box in boxes for part in box.subtract(cut)]


def disjoint_union(boxes: Iterable[Box]) -> list[Box]:
    """Disjoint boxes covering exactly the union of `boxes`, in a fixed order. Identical boxes
    (replicas) collapse first and only overlapping boxes are subtracted, so the common cases
    (replicas, disjoint shards) cost no subtraction."""
    unique = sorted(set(boxes))
    if _separated(unique):
        return unique
    out: list[Box] = []
    for box in unique:
        parts = [box]
        for done in out:
            if parts and done.overlaps(box):
                parts = subtract_all(parts, done)
        out.extend(parts)
    return out


def _separated(boxes: list[Box]) -> bool:
    """True when one dimension alone shows the boxes pairwise disjoint (e.g. shards of one split):
    sorted along it, each interval starts at or after the previous one stops. O(n·ndim)."""
    if len(boxes) <= 1:
        return True
    for d in range(boxes[0].ndim):
        ordered = sorted(boxes, key=lambda b: b.start[d])
        if all(a.stop[d] <= b.start[d] for a, b in zip(ordered, ordered[1:])):
            return True
    return False


def split_box(box: Box, max_volume: int) -> list[Box]:
    """Cut `box` into row-major consecutive boxes of at most `max_volume` elements each."""
    if max_volume < 1:
        raise IRError(f"cannot split box {box} into parts of {max_volume} elements")
    if box.volume <= max_volume or box.ndim == 0:
        return [box]
    inner = box.volume // box.shape[0]
    if inner <= max_volume:
        step = max_volume // inner
        cuts = range(box.start[0], box.stop[0], step)
        return [Box._trusted((a,) + box.start[1:], (min(a + step, box.stop[0]),) + box.stop[1:]) for a in cuts]
    tail = split_box(Box(box.start[1:], box.stop[1:]), max_volume)
    return [Box((r,) + t.start, (r + 1,) + t.stop) for r in range(box.start[0], box.stop[0]) for t in tail]


def row_major_boxes(shape: Sequence[int], start: int, stop: int) -> list[Box]:
    """Boxes of an array of `shape` covering flat row-major indices [start, stop), in order.

    Each returned box's row-major order equals the order of its flat indices, so consecutive
    boxes map to consecutive runs. At most 2·ndim - 1 boxes.
    """
    if not 0 <= start <= stop <= math.prod(shape):
        raise IRError(f"flat range [{start}, {stop}) is outside an array of shape {tuple(shape)}")
    if start == stop:
        return []
    if len(shape) <= 1:
        return [Box((start,), (stop,))] if shape else [Box((), ())]
    inner = math.prod(shape[1:])
    row0, off0 = divmod(start, inner)
    row1, off1 = divmod(stop, inner)
    out: list[Box] = []

    def rows_of(row: int, a: int, b: int) -> list[Box]:
        return [Box((row,) + s.start, (row + 1,) + s.stop) for s in row_major_boxes(shape[1:], a, b)]

    if row0 == row1:
        return rows_of(row0, off0, off1)
    if off0:
        out += rows_of(row0, off0, inner)
        row0 += 1
    if row1 > row0:
        out.append(Box((row0,) + (0,) * (len(shape) - 1), (row1,) + tuple(shape[1:])))
    if off1:
        out += rows_of(row1, 0, off1)
    return out
