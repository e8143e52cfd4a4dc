"""`OpTable` and `MessageTable`: a plan's ops and messages as numpy columns.

A large plan is mostly copy ops and messages (424k and 215k for GPT-3 175B at 1024 GPUs). One
Python object each costs about a microsecond to build and as much again every time a pass or
the checker reads its fields, so the passes after `select-sources` carry them as columns and a
compiled `Plan` keeps those columns: `Plan.ops` and `Plan.messages` are `PlanOps` and
`PlanMessages`, sequences that build the same frozen objects (same values, same order) the
first time a consumer reads an element, and keep them. Plans read from JSON hold objects; the
columns of any plan come from `op_table(plan)` and `message_table(plan)`.

Columns of copies: sub-tensor ids and tensor names interned (`sids`, `tensors`: the column holds
the index), boxes interned (`boxes`: distinct `Box` objects, `box`: the index; `pad` gives the
padded start/stop arrays), devices and piece indices as ints, `forward` for `src_side == "dst"`.
Fills and value ops (a few per partition) stay objects in `others`.

Invariants:
- `copy_at` (op ids of the copies, increasing) and the ids in `others` partition 0..n-1;
- message `i` of a `MessageTable` lists `ops[offsets[i]:offsets[i + 1]]`;
- `objects()` returns exactly the objects the columns describe, in op (message) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from operator import attrgetter
from typing import Any

import attrs
import numpy as np

from tenplex.compiler.ops import SIDES, CopyOp, Op, trusted_copy
from tenplex.ir.box import Box

I64 = np.int64


@attrs.frozen(eq=False)
class OpTable:
    n: int  # ops in the plan
    copy_at: np.ndarray  # op ids of the copies, increasing
    tensors: tuple[str, ...]
    sids: tuple[str, ...]
    boxes: tuple[Box, ...]
    tensor: np.ndarray  # per copy: index into `tensors`
    box: np.ndarray  # per copy: index into `boxes`
    src_dev: np.ndarray
    src_sid: np.ndarray
    src_piece: np.ndarray
    dst_dev: np.ndarray
    dst_sid: np.ndarray
    dst_piece: np.ndarray
    forward: np.ndarray  # bool: reads a dst piece (src_side "dst")
    others: tuple[tuple[int, Op], ...]  # (op id, fill or value op), by op id

    @classmethod
    def from_ops(cls, ops: Sequence[Op]) -> OpTable:
        """The columns of objects (a plan read from JSON). Raises TypeError for a field of the
        wrong type and KeyError for an unknown `src_side` (callers fall back to the objects)."""
        at = [i for i, op in enumerate(ops) if type(op) is CopyOp]
        copies = [ops[i] for i in at]
        n = len(copies)
        tensors: dict[str, int] = {}
        sids: dict[str, int] = {}
        boxes: dict[int, int] = {}
        distinct: list[Box] = []

        def interned(values, table: dict) -> np.ndarray:
            return np.fromiter((table.setdefault(v, len(table)) for v in values), I64, n)

        for b in map(attrgetter("box"), copies):
            if id(b) not in boxes:
                boxes[id(b)] = len(distinct)
                distinct.append(b)

        def col(name: str) -> np.ndarray:
            return np.fromiter(map(attrgetter(name), copies), I64, n)

        tensor = interned(map(attrgetter("tensor"), copies), tensors)
        src_sid = interned(map(attrgetter("src_subtensor"), copies), sids)
        dst_sid = interned(map(attrgetter("dst_subtensor"), copies), sids)
        side = np.fromiter((SIDES.index(s) for s in map(attrgetter("src_side"), copies)), I64, n)
        box = np.fromiter((boxes[id(b)] for b in map(attrgetter("box"), copies)), I64, n)
        others = tuple((i, op) for i, op in enumerate(ops) if type(op) is not CopyOp)
        return cls(len(ops), np.array(at, I64), tuple(tensors), tuple(sids), tuple(distinct), tensor, box,
                   col("src_device"), src_sid, col("src_piece"), col("dst_device"), dst_sid, col("dst_piece"),
                   side == 1, others)  # fmt: skip

    @cached_property
    def padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, stops, ndims) per copy: (n, k) int64, k the largest ndim (at least 1), the
        dims past a box's ndim set to [0, 1) so volumes and containment need no ndim case."""
        lo, hi, nd = pad(self.boxes)
        return lo[self.box], hi[self.box], nd[self.box]

    @cached_property
    def volume(self) -> np.ndarray:
        """Elements per copy (int64; OverflowError past it)."""
        return np.fromiter(map(attrgetter("volume"), self.boxes), I64, len(self.boxes))[self.box]

    def objects(self) -> tuple[Op, ...]:
        out: list[Any] = [None] * self.n
        tensors, sids, boxes = self.tensors, self.sids, self.boxes
        cols = (self.tensor, self.box, self.src_dev, self.src_sid, self.src_piece, self.dst_dev, self.dst_sid,
                self.dst_piece, self.forward)  # fmt: skip
        for i, t, b, sd, ss, sp, dd, ds, dp, fw in zip(self.copy_at.tolist(), *(c.tolist() for c in cols)):
            out[i] = trusted_copy(tensors[t], boxes[b], sd, sids[ss], sp, dd, sids[ds], dp, "dst" if fw else "src")
        for i, op in self.others:
            out[i] = op
        return tuple(out)


def pad(boxes: Sequence[Box]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, stops, ndims) of `boxes`: (n, k) arrays, k the largest ndim (at least 1), dims
    past a box's ndim set to [0, 1). OverflowError past int64."""
    starts = list(map(attrgetter("start"), boxes))
    nd = np.fromiter(map(len, starts), I64, len(boxes))
    k = max(int(nd.max(initial=0)), 1)
    total = int(nd.sum())
    rows = np.repeat(np.arange(len(boxes)), nd)
    cols = np.arange(total) - np.repeat(np.cumsum(nd) - nd, nd)
    lo, hi = np.zeros((len(boxes), k), I64), np.ones((len(boxes), k), I64)
    lo[rows, cols] = np.fromiter((x for s in starts for x in s), I64, total)
    hi[rows, cols] = np.fromiter((x for b in boxes for x in b.stop), I64, total)
    return lo, hi, nd


@attrs.frozen(eq=False)
class MessageTable:
    hosts: tuple[str, ...]
    id: np.ndarray
    src: np.ndarray  # index into `hosts`
    dst: np.ndarray
    bytes: np.ndarray
    round: np.ndarray
    offsets: np.ndarray  # m + 1: message i lists ops[offsets[i]:offsets[i + 1]]
    ops: np.ndarray

    def __len__(self) -> int:
        return len(self.id)

    @classmethod
    def from_messages(cls, messages: Sequence) -> MessageTable:
        """Raises OverflowError or TypeError for values that are no int64."""
        m = len(messages)
        hosts: dict[str, int] = {}

        def col(name: str) -> np.ndarray:
            return np.fromiter(map(attrgetter(name), messages), I64, m)

        src = np.fromiter((hosts.setdefault(x.src_host, len(hosts)) for x in messages), I64, m)
        dst = np.fromiter((hosts.setdefault(x.dst_host, len(hosts)) for x in messages), I64, m)
        lens = np.fromiter((len(x.ops) for x in messages), I64, m)
        flat = np.fromiter((i for x in messages for i in x.ops), I64, int(lens.sum()))
        return cls(tuple(hosts), col("id"), src, dst, col("bytes"), col("round"), np.concatenate(([0], np.cumsum(lens))), flat)

    @property
    def lens(self) -> np.ndarray:
        return np.diff(self.offsets)

    def objects(self) -> tuple:
        from tenplex.compiler.plan import trusted_message  # plan imports this module

        hosts, flat, bounds = self.hosts, self.ops.tolist(), self.offsets.tolist()
        cols = (c.tolist() for c in (self.id, self.src, self.dst, self.bytes, self.round))
        return tuple(trusted_message(i, hosts[s], hosts[d], tuple(flat[bounds[k]:bounds[k + 1]]), b, r)
                     for k, (i, s, d, b, r) in enumerate(zip(*cols)))  # fmt: skip


class _Lazy(Sequence):
    """A tuple of objects built from a table the first time an element is read."""

    def __init__(self, table: Any, n: int):
        self.table, self._n, self._objects = table, n, None

    @property
    def objects(self) -> tuple:
        if self._objects is None:
            self._objects = self.table.objects()
        return self._objects

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self.objects[i]

    def __iter__(self):
        return iter(self.objects)

    def __add__(self, other: tuple) -> tuple:
        return self.objects + tuple(other) if isinstance(other, (tuple, _Lazy)) else NotImplemented

    def __radd__(self, other: tuple) -> tuple:
        return tuple(other) + self.objects if isinstance(other, tuple) else NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Lazy):
            other = other.objects
        return isinstance(other, tuple) and self.objects == other

    def __hash__(self) -> int:
        return hash(self.objects)

    def __repr__(self) -> str:
        return repr(self.objects)


class PlanOps(_Lazy):
    """`Plan.ops` of a compiled plan: its `OpTable`, objects on first read."""

    def __init__(self, table: OpTable):
        super().__init__(table, table.n)


class PlanMessages(_Lazy):
    """`Plan.messages` of a compiled plan: its `MessageTable`, objects on first read."""

    def __init__(self, table: MessageTable):
        super().__init__(table, len(table))


def op_table(plan) -> OpTable:
    """The plan's ops as columns: a compiled plan's own, or built from its objects."""
    return plan.ops.table if isinstance(plan.ops, PlanOps) else OpTable.from_ops(plan.ops)


def message_table(plan) -> MessageTable:
    """The plan's messages as columns: a compiled plan's own, or built from its objects."""
    return plan.messages.table if isinstance(plan.messages, PlanMessages) else MessageTable.from_messages(plan.messages)
