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

Invariants (checked when an op is built, so a plan file cannot smuggle in a malformed op):
- devices and piece indices are ints, ids and names are strings, boxes are `Box`es;
- boxes of copies are non-empty; src_side is "src" or "dst";
- a fill value is a number;
- a value op either copies (`src_partition` and `src_device` set, no literal `value`) or sets a
  literal (neither set).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import attrs

from tenplex.ir.box import Box
from tenplex.ir.errors import IRError

SIDES = ("src", "dst")


def check_types(what: str, fields: dict[str, Any], kinds: dict[str, tuple[type, ...]]) -> None:
    """Raise IRError naming the first field whose value is not one of its `kinds` (a bool is
    no device id, though Python calls it an int)."""
    for name, kind in kinds.items():
        v = fields[name]
        if not isinstance(v, kind) or isinstance(v, bool) and bool not in kind:
            raise IRError(f"{what} field {name!r} is {fields[name]!r}; expected {' or '.join(k.__name__ for k in kind)}")


_INT, _STR, _BOX = (int,), (str,), (Box,)
_COPY_TYPES = {"tensor": _STR, "box": _BOX, "src_device": _INT, "src_subtensor": _STR, "src_piece": _INT,
               "dst_device": _INT, "dst_subtensor": _STR, "dst_piece": _INT, "src_side": _STR}  # fmt: skip
_FILL_TYPES = {"dst_device": _INT, "dst_subtensor": _STR, "box": _BOX, "value": (int, float)}
_VALUE_TYPES = {"dst_device": _INT, "dst_partition": _STR, "name": _STR,
                "src_device": (int, type(None)), "src_partition": (str, type(None))}  # fmt: skip


class Holder(NamedTuple):
    """A src sub-tensor piece holding a region, on one device (a tuple: cheap to sort)."""

    device: int
    subtensor: str
    piece: int


as_holder = partial(tuple.__new__, Holder)  # Holder(d, sid, i) from a tuple, without namedtuple's Python __new__


@attrs.frozen
class Need:
    """Region `box` (global) that dst piece (`dst_subtensor`, `dst_piece`) needs on each of
    `dst_devices`; every holder holds all of it."""

    tensor: str
    box: Box
    dst_devices: tuple[int, ...]
    dst_subtensor: str
    dst_piece: int
    holders: tuple[Holder, ...]  # or a `holders.HolderRows`, which reads as one


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
        if not (type(self.src_device) is int and type(self.dst_device) is int and type(self.src_piece) is int
                and type(self.dst_piece) is int and type(self.box) is Box and type(self.tensor) is str
                and type(self.src_subtensor) is str and type(self.dst_subtensor) is str):  # fmt: skip
            check_types("copy", attrs.asdict(self, recurse=False), _COPY_TYPES)
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

    def __attrs_post_init__(self) -> None:
        if not (type(self.dst_device) is int and type(self.dst_subtensor) is str and type(self.box) is Box
                and type(self.value) in (int, float)):  # fmt: skip
            check_types("fill", attrs.asdict(self, recurse=False), _FILL_TYPES)

    kind = "fill"


@attrs.frozen
class ValueOp:
    dst_device: int
    dst_partition: str
    name: str
    src_device: int | None = None
    src_partition: str | None = None
    value: Any = None

    def __attrs_post_init__(self) -> None:
        if not (type(self.dst_device) is int and type(self.dst_partition) is str and type(self.name) is str
                and type(self.src_device) in (int, type(None)) and type(self.src_partition) in (str, type(None))):  # fmt: skip
            check_types("value op", attrs.asdict(self, recurse=False), _VALUE_TYPES)
        if (self.src_device is None) != (self.src_partition is None):
            raise IRError(f"value op for {self.name!r} has src_device {self.src_device!r} and src_partition {self.src_partition!r}; give both or neither")
        if self.src_partition is not None and self.value is not None:
            raise IRError(f"value op for {self.name!r} copies from src partition {self.src_partition!r} and also carries the literal {self.value!r}")

    kind = "value"


Op = CopyOp | FillOp | ValueOp

_COPY_SET = tuple(CopyOp.__dict__[f.name].__set__ for f in attrs.fields(CopyOp))  # slot setters, in field order


def trusted_copy(tensor: str, box: Box, src_device: int, src_subtensor: str, src_piece: int,
                 dst_device: int, dst_subtensor: str, dst_piece: int, src_side: str = "src") -> CopyOp:  # fmt: skip
    """A `CopyOp` from fields the compiler's passes derived from a valid PTC (ints, strings, a
    non-empty `Box`): sets the slots without `__init__`'s checks, at less than half the cost.
    Plan files never come through here (`plan_from_json` builds checked ops), and `check_plan`
    still proves every op of a compiled plan."""
    op = object.__new__(CopyOp)
    t, b, sd, ss, sp, dd, ds, dp, side = _COPY_SET
    t(op, tensor)
    b(op, box)
    sd(op, src_device)
    ss(op, src_subtensor)
    sp(op, src_piece)
    dd(op, dst_device)
    ds(op, dst_subtensor)
    dp(op, dst_piece)
    side(op, src_side)
    return op


_NEED_SET = tuple(Need.__dict__[f.name].__set__ for f in attrs.fields(Need))


def trusted_need(tensor: str, box: Box, dst_devices: tuple[int, ...], dst_subtensor: str, dst_piece: int, holders) -> Need:
    """A `Need` without attrs' `__init__` (slot setters: about half the cost; the diff puts
    37k needs from its templates at 1024 GPUs). Needs carry no checks, so it is the same op."""
    op = object.__new__(Need)
    t, b, dd, ds, dp, h = _NEED_SET
    t(op, tensor)
    b(op, box)
    dd(op, dst_devices)
    ds(op, dst_subtensor)
    dp(op, dst_piece)
    h(op, holders)
    return op


def trusted_needs(tensor: str, rows, dst_devices, dst_subtensors, holders) -> list[Need]:
    """`trusted_need` of each template row (dst position k, piece j, box, holder tuple number h):
    one loop with the setters bound once, not a call per need (~0.015 of ~0.045 CPU s for 37k)."""
    new, out = object.__new__, []
    t, b, dd, ds, dp, hs = _NEED_SET
    for k, j, box, h in rows:
        op = new(Need)
        t(op, tensor)
        b(op, box)
        dd(op, dst_devices[k])
        ds(op, dst_subtensors[k])
        dp(op, j)
        hs(op, holders[h])
        out.append(op)
    return out
