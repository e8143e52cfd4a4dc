"""One agent's share of a plan, round by round, from its slice (`compiler.emit.slices`).

`Execution` decodes the slice (int64 tables viewed in place, no plan or PTC parsing), holds this
host's src and dst arrays and builds each region's view from its row. `run` executes every
round in order: fills and values first, then per round the local copies (region to region)
overlapping the round's network parts, all posted at once to all peers (`UcxPeer.exchange`,
no headers): a part contiguous on this side goes straight from or into its view, the others
are packed into and unpacked from the scratch pool (`parts`). No barrier between rounds: a
round's data only depends on earlier rounds of the hosts that send it, which they finish
before sending. Every failure is an ExecutionError naming the op or message.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from tenplex.compiler.emit.slices import FORMAT, TABLES
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import parts
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.store.layout import staging_tag, value_path
from tenplex.runtime.store.tree import StoreError, TensorStore

EPOCH_SHIFT = 28  # a part's UCX tag: the execution's epoch (8 bits) above the part's plan-wide index


class Execution:
    """One plan being executed by this host: its decoded slice and its arrays (see the module doc)."""

    def __init__(self, host: str, job: str, src_tag: str, dst_tag: str, sl: Mapping[str, Any]):
        self.host, self.job, self.src_tag, self.dst_tag = host, job, src_tag, dst_tag
        self.staging = staging_tag(dst_tag)
        if not isinstance(sl, Mapping) or sl.get("format") != FORMAT or sl.get("host") != host:
            got = (sl.get("format"), sl.get("host")) if isinstance(sl, Mapping) else type(sl).__name__
            raise ExecutionError(f"agent {host!r} got a slice {got!r}, expected a {FORMAT} slice for {host!r}")
        self.meta = sl["arrays"]  # [side, subtensor, device, dtype, shape] per array index
        self.arrays: list[np.ndarray] = []  # filled by the agent in `meta` order
        self.rounds, self.peers, self.values = int(sl["rounds"]), list(sl["peers"]), list(sl["values"])
        self.fill_values = list(sl["fill_values"])
        ndim = int(sl["ndim"])
        self.ndim = ndim
        self.regions = _table(sl, "regions", 3 + 2 * ndim)
        self.fills = _table(sl, "fills", TABLES["fills"])
        self.part_regions = _table(sl, "part_regions", TABLES["part_regions"])
        self.copies: dict[int, list[list[int]]] = defaultdict(list)
        for row in _table(sl, "copies", TABLES["copies"]):
            self.copies[row[0]].append(row)
        self.parts: dict[int, list[list[int]]] = defaultdict(list)
        for row in _table(sl, "parts", TABLES["parts"]):
            self.parts[row[0]].append(row)
        self.done = 0  # rounds finished
        self.seconds: dict[str, float] = {}  # time per activity: local, pack, exchange, unpack

    def view(self, r: int) -> np.ndarray:
        """The strided view of region row `r` in its array (bounds checked by numpy)."""
        row = self.regions[r]
        base, n = self.arrays[row[0]], row[2]
        item = base.itemsize
        shape, strides = row[3 : 3 + n], [s * item for s in row[3 + self.ndim : 3 + self.ndim + n]]
        return np.ndarray(shape, base.dtype, buffer=base, offset=row[1] * item, strides=strides)

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0


def _table(sl: Mapping[str, Any], name: str, width: int) -> list[list[int]]:
    raw = sl.get(name)
    if not isinstance(raw, bytes) or len(raw) % (8 * width):
        raise ExecutionError(f"slice field {name!r} is not int64 rows of {width} (got {type(raw).__name__})")
    return np.frombuffer(raw, "<i8").reshape(-1, width).tolist()


def source(store: TensorStore, path: str, shape: list[int], dtype: str) -> np.ndarray:
    """The src array at `path`, checked against the slice's shape and dtype."""
    try:
        got = store.get(path)
    except StoreError:
        raise ExecutionError(f"src array {path} is missing") from None
    if not isinstance(got, np.ndarray) or got.shape != tuple(shape) or got.dtype != np_dtype(dtype):
        what = f"{got.dtype}{list(got.shape)}" if isinstance(got, np.ndarray) else type(got).__name__
        raise ExecutionError(f"src array {path} is {what}, the plan reads {dtype}{list(shape)}")
    return got


def src_values(store: TensorStore, job: str, tag: str, wanted: list[tuple[int, str, int, str]]) -> dict[int, Any]:
    """{op id: value} for (op id, partition, device, name) of values this host holds."""
    out = {}
    for op_id, pid, device, name in wanted:
        path = value_path(job, tag, device, pid, name)
        if not store.exists(path):
            raise ExecutionError(f"value op {op_id}: src value {path} is missing")
        out[op_id] = store.get(path)
    return out


def run(ex: Execution, store: TensorStore, values: Mapping[int, Any], peer: Callable[[], Any],
        endpoint: Callable[[str], Any], scratch: parts.Scratch, epoch: int) -> int:  # fmt: skip
    """Every round of this host's slice, in order; returns the bytes it sent."""
    sent = 0
    fills_and_values(ex, store, values)
    for r in range(ex.rounds):
        work = local(ex, ex.copies.get(r, []))
        if ex.parts.get(r):
            sent += network(ex, r, peer(), endpoint, scratch, epoch, work)
        else:
            for _ in work:
                pass
        ex.done = r + 1
    return sent


def fills_and_values(ex: Execution, store: TensorStore, values: Mapping[int, Any]) -> None:
    """This host's fill ops, and its value ops (`values`: {op id: src value} of other hosts,
    passed on by the runtime; src values on this host are read here)."""
    for region, k in ex.fills:
        with _named(f"fill of region {region} with {ex.fill_values[k]!r}"):
            ex.view(region)[...] = ex.fill_values[k]
    for op_id, device, partition, name, src_partition, src_device, literal in ex.values:
        with _named(f"op {op_id} (ValueOp on device {device})"):
            if src_partition is None:
                value = literal
            else:
                value = values[op_id] if op_id in values else store.get(value_path(ex.job, ex.src_tag, src_device, src_partition, name))
            store.put(value_path(ex.job, ex.staging, device, partition, name), value, replace=True)


def local(ex: Execution, copies: list[list[int]]) -> Iterator[None]:
    """The copies within this host, one op (region to region) per step: a generator, so that
    `network` can interleave them with the round's transfers."""
    for r, message, op, src, dst in copies:
        with _named(f"message {message} ({ex.host} -> {ex.host}, round {r}), op {op}"), ex.timed("local"):
            ex.view(dst)[...] = ex.view(src)
        yield


def network(ex: Execution, r: int, peer: Any, endpoint: Callable[[str], Any], scratch: parts.Scratch,
            epoch: int, work: Iterator[None]) -> int:  # fmt: skip
    """Exchange round `r`'s network parts with every peer at once; returns bytes sent. `work`
    (the round's local copies) runs while the transfers progress."""
    sends: list = []
    recvs: list = []
    unpacks: list[tuple[str, list[np.ndarray], np.ndarray]] = []
    with ex.timed("pack"):
        plan = []
        for _, p, outgoing, tag, nbytes, first, count, message in ex.parts[r]:
            other = ex.peers[p]
            what = (f"message {message} ({ex.host} -> {other}" if outgoing else f"message {message} ({other} -> {ex.host}") + \
                f", round {r}, ops {[row[1] for row in ex.part_regions[first:first + min(count, 4)]]}{'...' if count > 4 else ''})"  # fmt: skip
            with _named(what):
                views = [ex.view(row[0]) for row in ex.part_regions[first : first + count]]
                if sum(v.nbytes for v in views) != nbytes:
                    raise ExecutionError(f"its regions hold {sum(v.nbytes for v in views)} B, the plan says {nbytes} B")
            in_place = len(views) == 1 and views[0].flags.c_contiguous
            plan.append((what, outgoing, endpoint(other), (epoch << EPOCH_SHIFT) | tag, nbytes, views, in_place))
        scratch.reserve(sum(nbytes for _, _, _, _, nbytes, _, in_place in plan if not in_place))
        for what, outgoing, ep, tag, nbytes, views, in_place in plan:
            buffer = views[0] if in_place else scratch.take(nbytes)
            if outgoing:
                if not in_place:
                    with _named(what):
                        parts.pack(views, buffer)
                sends.append((ep, buffer, tag))
            else:
                recvs.append((ep, buffer, tag))
                if not in_place:
                    unpacks.append((what, views, buffer))
    try:
        with ex.timed("exchange"):
            peer.exchange(sends, recvs, work=work)
    except ExecutionError:
        raise
    except Exception as e:
        ids = sorted({row[7] for row in ex.parts[r]})
        raise ExecutionError(f"round {r}: exchanging messages {ids[:8]}{'...' if len(ids) > 8 else ''} with peers "
                             f"failed: {type(e).__name__}: {e}") from e  # fmt: skip
    with ex.timed("unpack"):
        for what, views, buffer in unpacks:
            with _named(what):
                parts.unpack(views, buffer)
    return sum(b.nbytes for _, b, _ in sends)


@contextlib.contextmanager
def _named(what: str) -> Iterator[None]:
    """Any failure in the block re-raised as an ExecutionError naming `what`."""
    try:
        yield
    except Exception as e:
        raise ExecutionError(f"{what} failed: {type(e).__name__}: {e}") from e
