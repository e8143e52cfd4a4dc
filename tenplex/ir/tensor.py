"""Logical tensors (T), pieces, and sub-tensors (σ): what one rank holds of one tensor.

A `SubTensor` is a local array of `shape`. Each `Piece(global_box, local_box)` says that the
global region `global_box` of the logical tensor lands at `local_box` of the local array; the
elements correspond in the row-major order of each box. Local elements that no piece covers are
*fill* (e.g. vocabulary padding rows) and hold `fill`.

Invariants:
- names, ids and paths are strings without NUL bytes (`tenplex.ir.names`);
- dtype is a known dtype name (numpy names plus bfloat16 and float8 kinds);
- shapes are non-negative integers;
- a piece's boxes have equal volume and either equal extents, or a 1-D local box (a flat run,
  as in ZeRO / distributed-optimizer buffers) with any global box;
- a piece's local box lies inside the sub-tensor's shape;
- the local boxes of one sub-tensor are pairwise disjoint;
- (checked by the PTC) global boxes lie inside the tensor's shape and have its ndim.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import attrs

from tenplex.ir.box import Box
from tenplex.ir.errors import IRError
from tenplex.ir.names import check_name
from tenplex.ir.sweep import overlapping_pairs

ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}  # fmt: skip


def itemsize(dtype: str) -> int:
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise IRError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(ITEMSIZE))}")
    return ITEMSIZE[dtype]


def _shape(values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(values)
    try:
        if any(isinstance(v, bool) or operator.index(v) < 0 for v in out):
            raise TypeError
    except TypeError:
        raise IRError(f"shape {list(out)} must be non-negative integers") from None
    return tuple(operator.index(v) for v in out)


def _dtype(_inst: object, _attr: object, value: str) -> None:
    itemsize(value)


@attrs.frozen
class TensorMeta:
    """A logical (global, unsharded) tensor."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: str = attrs.field(validator=_dtype)

    def __attrs_post_init__(self) -> None:
        check_name("tensor name", self.name)

    @property
    def box(self) -> Box:
        return Box._trusted((0,) * len(self.shape), self.shape)  # shape: non-negative ints (`_shape`)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


@attrs.frozen
class Piece:
    """Global region `global_box` of the tensor stored at `local_box` of the local array."""

    global_box: Box
    local_box: Box

    def __attrs_post_init__(self) -> None:
        g, lo = self.global_box, self.local_box
        if g.volume != lo.volume:
            raise IRError(f"piece global box {g} has volume {g.volume} but local box {lo} has {lo.volume}")
        if g.shape != lo.shape and lo.ndim != 1:
            raise IRError(f"piece global box {g} and local box {lo} differ in extents and the local box is not 1-D")

    @property
    def flat(self) -> bool:
        """True when the local side is a 1-D run of a multi-extent global box."""
        return self.global_box.shape != self.local_box.shape

    def to_local(self, region: Box) -> Box:
        """The local box of a global `region` inside this piece (equal-extent pieces only)."""
        if self.flat:
            raise IRError(f"region {region} of flat piece {self.global_box} has no local box")
        return region.relative_to(self.global_box.start).translate(self.local_box.start)

    def to_global(self, region: Box) -> Box:
        """The global box of a local `region` inside this piece (equal-extent pieces only)."""
        if self.flat:
            raise IRError(f"local region {region} of flat piece {self.local_box} has no global box")
        return region.relative_to(self.local_box.start).translate(self.global_box.start)


def _pieces(values: Sequence[Piece]) -> tuple[Piece, ...]:
    return tuple(values)


@attrs.frozen
class SubTensor:
    """What one rank holds of one tensor: a local array assembled from pieces plus fill."""

    id: str
    tensor: str
    path: str
    shape: tuple[int, ...] = attrs.field(converter=_shape)
    pieces: tuple[Piece, ...] = attrs.field(converter=_pieces)
    fill: float = 0

    def __attrs_post_init__(self) -> None:
        check_name("sub-tensor id", self.id)
        check_name(f"sub-tensor {self.id!r} tensor", self.tensor)
        check_name(f"sub-tensor {self.id!r} path", self.path)
        local = self.local_box
        for i, p in enumerate(self.pieces):
            if p.local_box.ndim != len(self.shape):
                raise IRError(f"sub-tensor {self.id!r} piece {i} local box {p.local_box} has {p.local_box.ndim} dims but shape {self.shape} has {len(self.shape)}")
            if not local.contains(p.local_box):
                raise IRError(f"sub-tensor {self.id!r} piece {i} local box {p.local_box} exceeds local shape {self.shape}")
        boxes = [p.local_box for p in self.pieces]
        for i, j in overlapping_pairs(boxes, boxes):
            if i < j:
                raise IRError(f"sub-tensor {self.id!r} pieces {i} and {j} overlap locally: {boxes[i]} and {boxes[j]}")

    @classmethod
    def _of_box(cls, sid: str, tensor: str, path: str, box: Box, fill: float) -> SubTensor:
        """`SubTensor(sid, tensor, path, box.shape, (Piece(box, local),), fill)` (`local`: the
        whole local array) from names already checked (strings without NUL bytes): one piece
        of equal extents inside the array cannot break an invariant, so neither the converters
        nor the checks run (parsing the `box` entries of a PTC file, `ir.serialize`)."""
        piece = object.__new__(Piece)
        _set(piece, "global_box", box)
        _set(piece, "local_box", Box._trusted((0,) * len(box.shape), box.shape))
        st = object.__new__(cls)
        for name, value in (("id", sid), ("tensor", tensor), ("path", path), ("shape", box.shape),
                            ("pieces", (piece,)), ("fill", fill)):  # fmt: skip
            _set(st, name, value)
        return st

    @property
    def local_box(self) -> Box:
        return Box._trusted((0,) * len(self.shape), self.shape)  # shape: non-negative ints (`_shape`)

    @property
    def volume(self) -> int:
        return math.prod(self.shape)

    def fill_boxes(self) -> list[Box]:
        """Local regions that no piece covers, as disjoint boxes in a fixed order."""
        volume = self.volume
        if not volume or any(p.local_box.volume == volume for p in self.pieces):
            return []  # a piece as large as the array (pieces lie inside it) leaves no fill
        rest = [self.local_box]
        for p in self.pieces:
            rest = [part for box in rest for part in box.subtract(p.local_box)]
        return rest


_set = object.__setattr__  # frozen attrs classes: how their own __init__ sets a field
