"""A host's slice of a plan, decoded once and compiled into what `rounds` runs (issue 16).

`Sliced(host, slice)` checks and decodes a `tenplex.slice/1` slice (`compiler.emit.slices`: int64
tables viewed in place, no plan or PTC parsing) and precomputes everything that does not depend
on the arrays of one execution: each region's view as (array, byte offset, shape, byte strides);
per round, the local copies in batches of about `BATCH_BYTES` (the unit `rounds.network`
interleaves with UCX progress) and the network parts with their regions, sizes (checked against
the plan's), UCX tags and whether a part goes straight from or into its view. An agent keeps the
`Sliced` of the plans it was sent under the runtime's slice id (`Agent.prepare`), so executing
the same plan again sends only that id and decodes nothing.

Invariants: a `Sliced` is immutable after construction (but for a memo of its arrays' store
paths per job and tag) and shared by every execution of its plan; every failure to decode is an ExecutionError naming the field, message or host.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tenplex.compiler.emit.slices import FORMAT, TABLES, c_contiguous
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.store.layout import array_path

BATCH_BYTES = 1 << 20  # local copies between two UCX progress calls
PATHS_KEPT = 8  # (job, tag, side) path lists a slice keeps
SLICES_KEPT = 4  # decoded slices an agent keeps per connection (by slice id), oldest first


class Part(NamedTuple):
    """One network part of a round, as this side moves it."""

    what: str  # "message M (a -> b, round r, ops [...])", for errors
    outgoing: bool
    peer: str
    tag: int  # the plan-wide part index (the epoch goes above it)
    nbytes: int
    regions: tuple[int, ...]
    in_place: bool  # one C-contiguous region: sent from or received into its view


class Sliced:
    """One host's decoded slice (see the module docstring)."""

    def __init__(self, host: str, sl: Mapping[str, Any]):
        if not isinstance(sl, Mapping) or sl.get("format") != FORMAT or sl.get("host") != host:
            got = (sl.get("format"), sl.get("host")) if isinstance(sl, Mapping) else type(sl).__name__
            raise ExecutionError(f"agent {host!r} got a slice {got!r}, expected a {FORMAT} slice for {host!r}")
        self.host = host
        self.meta = sl["arrays"]  # [side, subtensor, device, dtype, shape] per array index
        self.rounds, self.peers, self.values = int(sl["rounds"]), list(sl["peers"]), list(sl["values"])
        self.fill_values = list(sl["fill_values"])
        self.gives = [g[:4] for g in sl["gives"]]
        self.ndim = ndim = int(sl["ndim"])
        self.regions = _table(sl, "regions", 3 + 2 * ndim)
        self.fills = _table(sl, "fills", TABLES["fills"])
        self.part_regions = _table(sl, "part_regions", TABLES["part_regions"])
        self.copies: dict[int, list[list[int]]] = defaultdict(list)
        for row in _table(sl, "copies", TABLES["copies"]):
            self.copies[row[0]].append(row)
        self.parts: dict[int, list[list[int]]] = defaultdict(list)
        for row in _table(sl, "parts", TABLES["parts"]):
            self.parts[row[0]].append(row)
        try:
            self.dtypes = [np_dtype(m[3]) for m in self.meta]
            self.shapes = [tuple(int(n) for n in m[4]) for m in self.meta]
            itemsizes = [dt.itemsize for dt in self.dtypes]
            self.views = [_view_args(row, ndim, itemsizes) for row in self.regions]
        except (TypeError, ValueError, IndexError) as e:
            raise ExecutionError(f"slice for {host!r}: malformed arrays or regions: {type(e).__name__}: {e}") from None
        self._paths: dict[tuple[str, str, str], tuple[list[int], list[str]]] = {}
        self.batches = {r: _batches(rows, self.views) for r, rows in self.copies.items()}
        self.network = {r: [self._part(r, row) for row in rows] for r, rows in self.parts.items()}

    def paths(self, job: str, tag: str, side: str) -> tuple[list[int], list[str]]:
        """The indices of this slice's `side` ("src" or "dst") arrays and their store paths under
        `tag` (`store.layout.array_path`), made once per (job, tag, side): every execution of a
        plan looks up the same paths."""
        key = (job, tag, side)
        if key not in self._paths:
            if len(self._paths) >= PATHS_KEPT:
                self._paths.clear()
            rows = [(i, array_path(job, tag, m[2], m[1])) for i, m in enumerate(self.meta) if m[0] == side]
            self._paths[key] = ([i for i, _ in rows], [path for _, path in rows])
        return self._paths[key]

    def _part(self, r: int, row: list[int]) -> Part:
        _, p, outgoing, tag, nbytes, first, count, message = row
        other = self.peers[p]
        ops = [x[1] for x in self.part_regions[first : first + min(count, 4)]]
        way = f"{self.host} -> {other}" if outgoing else f"{other} -> {self.host}"
        what = f"message {message} ({way}, round {r}, ops {ops}{'...' if count > 4 else ''})"
        regions = tuple(x[0] for x in self.part_regions[first : first + count])
        held = sum(self.views[i][4] for i in regions)
        if held != nbytes:
            raise ExecutionError(f"{what}: its regions hold {held} B, the plan says {nbytes} B")
        one = len(regions) == 1 and self.views[regions[0]][5]
        return Part(what, bool(outgoing), other, tag, nbytes, regions, bool(one))


class View(NamedTuple):
    array: int
    offset: int  # bytes
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    nbytes: int
    contiguous: bool


def _view_args(row: list[int], ndim: int, itemsizes: list[int]) -> View:
    array, offset, n = row[0], row[1], row[2]
    item = itemsizes[array]
    shape, strides = tuple(row[3 : 3 + n]), tuple(row[3 + ndim : 3 + ndim + n])
    size = item
    for e in shape:
        size *= e
    return View(array, offset * item, shape, tuple(s * item for s in strides), size, c_contiguous(shape, strides))


def _batches(rows: list[list[int]], views: list[View]) -> list[list[list[int]]]:
    """Copy rows in batches of about BATCH_BYTES, in order."""
    out: list[list[list[int]]] = [[]]
    size = 0
    for row in rows:
        if size >= BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(row)
        size += views[row[4]].nbytes
    return out if rows else []


def _table(sl: Mapping[str, Any], name: str, width: int) -> list[list[int]]:
    raw = sl.get(name)
    if not isinstance(raw, bytes) or len(raw) % (8 * width):
        raise ExecutionError(f"slice field {name!r} is not int64 rows of {width} (got {type(raw).__name__})")
    return np.frombuffer(raw, "<i8").reshape(-1, width).tolist()


class KeptSlices:
    """An agent's decoded slices by the id its runtime gave them (`slices`): the last SLICES_KEPT
    sent on its connection, in the order they were sent (`agent.slicing` mirrors that order)."""

    host: str
    slices: dict[str, Sliced]

    def keep_slice(self, slice: dict, slice_id: str) -> None:
        """Decode and keep this host's slice of a plan under `slice_id` for a later `prepare` (`Runtime.stage`)."""
        self._sliced(slice, slice_id)

    def _sliced(self, sl: dict | None, slice_id: str | None) -> Sliced:
        """The decoded slice: `sl` (kept under `slice_id` when given), else the one kept under `slice_id`."""
        if sl is not None:
            decoded = Sliced(self.host, sl)
            if slice_id is not None:
                self.slices.pop(slice_id, None)
                self.slices[slice_id] = decoded
                while len(self.slices) > SLICES_KEPT:
                    self.slices.pop(next(iter(self.slices)))
            return decoded
        if slice_id is None or slice_id not in self.slices:
            raise ExecutionError(f"prepare without a slice: slice id {slice_id!r} was not sent to agent {self.host!r} "
                                 "on this connection (send the slice)")  # fmt: skip
        return self.slices[slice_id]
