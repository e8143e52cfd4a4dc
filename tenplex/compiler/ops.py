"""The ops of a reconfiguration plan: frozen nouns on the nodes of the op graph.

- `CopyOp` writes the global region `box` of `tensor` into piece `dst_piece` of dst sub-tensor
  `dst_subtensor` on `dst_device`, reading it from piece `src_piece` of `src_subtensor` on
  `src_device`. With `src_side == "src"` the source is the src state; with `"dst"` it is a dst
  sub-tensor that an earlier op (an `order` edge) already wrote on `src_device` (forwarding
  inside a host). Boxes of copies are *global* coordinates: each piece maps them to its local
  array (a slice for equal-extent pieces, a reshaped flat run for 1-D local pieces).
- `FillOp` writes `value` into the local box `box` of a dst sub-tensor (regions no piece covers).
- `ValueOp` sets a non-tensor value of a dst partition: copied from a src partition's value
  (`src_partition` set), or the literal `value` carried by the dst PTC.
- `Need` is a copy whose source is not chosen yet: the diff's output, resolved by
  `select_sources`. Plans never contain a `Need`.

Invariants: boxes of copies are non-empty; src_side is "src" or "dst".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs

from tenplex.ir.box import Box
from tenplex.ir.errors import IRError

SIDES = ("src", "dst")


class Holder(NamedTuple):
    """A src sub-tensor piece holding a region, on one device (a tuple: cheap to sort)."""

    device: int
    subtensor: str
    piece: int


@attrs.frozen
class Need:
    """Region `box` (global) that dst piece (`dst_subtensor`, `dst_piece`) needs on each of
    `dst_devices`; every holder holds all of it."""

    tensor: str
    box: Box
    dst_devices: tuple[int, ...]
    dst_subtensor: str
    dst_piece: int
    holders: tuple[Holder, ...]


@attrs.frozen
class CopyOp:
    tensor: str
    box: Box
    src_device: int
    src_subtensor: str
    src_piece: int
    dst_device: int
    dst_subtensor: str
    dst_piece: int
    src_side: str = "src"

    def __attrs_post_init__(self) -> None:
        if self.box.empty:
            raise IRError(f"copy of {self.tensor!r} has an empty box {self.box}")
        if self.src_side not in SIDES:
            raise IRError(f"copy src_side {self.src_side!r} is not one of {list(SIDES)}")

    kind = "copy"


@attrs.frozen
class FillOp:
    dst_device: int
    dst_subtensor: str
    box: Box
    value: float = 0

    kind = "fill"


@attrs.frozen
class ValueOp:
    dst_device: int
    dst_partition: str
    name: str
    src_device: int | None = None
    src_partition: str | None = None
    value: Any = None

    kind = "value"


Op = CopyOp | FillOp | ValueOp
