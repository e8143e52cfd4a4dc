"""One agent's share of a plan, round by round, from its slice (`compiler.emit.slices`).

`Execution` decodes the slice (int64 tables viewed in place, no plan or PTC parsing), holds this
host's src and dst arrays and builds each region's view from its row. `run` executes every
round in order: fills and values first, then per round the local copies (region to region)
overlapping the round's network parts, all posted at once to all peers (`UcxPeer.exchange`,
no headers): a part contiguous on this side goes straight from or into its view, the others
are packed into and unpacked from the scratch pool (`parts`). Sends to pack are staged: the
ready ones go out first and each packed one is posted as soon as it is packed, so the links
carry bytes from the start of the round instead of after every pack. Parts between agents on one
node skip UCX: the sender copies them into the receiver's dst arena (`direct`: an offer at
the start, a `done` per round but the last). No barrier between rounds: a
round's data only depends on earlier rounds of the hosts that send it, which they finish
before sending. Every failure is an ExecutionError naming the op or message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import direct, parts
from tenplex.runtime.agent.sliced import Sliced
from tenplex.runtime.store.layout import staging_tag, value_path
from tenplex.runtime.store.tree import StoreError, TensorStore
from tenplex.runtime.transport.ucx.wire import CTL

EPOCH_SHIFT = direct.EPOCH_SHIFT  # a part's UCX tag: the epoch (8 bits) above the part's plan-wide index


class Execution:
    """One plan being executed by this host: its decoded slice (`Sliced`, shared by every
    execution of the plan) and this execution's arrays and progress (see the module doc)."""

    def __init__(self, host: str, job: str, src_tag: str, dst_tag: str, sl: Mapping[str, Any] | Sliced):
        self.host, self.job, self.src_tag, self.dst_tag = host, job, src_tag, dst_tag
        self.staging = staging_tag(dst_tag)
        self.sliced = sl if isinstance(sl, Sliced) else Sliced(host, sl)
        if self.sliced.host != host:
            raise ExecutionError(f"agent {host!r} got a slice for {self.sliced.host!r}")
        s = self.sliced
        self.meta, self.rounds, self.peers, self.values, self.fill_values = s.meta, s.rounds, s.peers, s.values, s.fill_values
        self.ndim, self.regions, self.fills, self.part_regions = s.ndim, s.regions, s.fills, s.part_regions
        self.copies, self.parts = s.copies, s.parts
        self.arrays: list[np.ndarray] = []  # filled by the agent in `meta` order
        self.done = 0  # rounds finished
        self.seconds: dict[str, float] = {"local": 0.0}  # per activity: local, setup, direct, views, exchange (pack within), unpack
        # bytes sent into peers' memory, through the transport; bytes of peers' memory mapped anew (`direct`)
        self.sent = {"direct_bytes": 0, "transport_bytes": 0, "mapped_bytes": 0}
        self.waiting: set[int] = set()  # value ops whose src value another host reads: written at the commit
        self.pending: Callable[[], Any] | None = None  # makes the dst arrays store leaves (`adopt`)
        self.places: dict[int, tuple[Any, int]] = {}  # (arena, byte offset) of dst arrays in a shared arena
        self._flat: dict[int, np.ndarray | None] = {}  # `flat`

    def adopt(self) -> None:
        """Make the dst arrays leaves of the store under staging, once (`Agent.prepare` leaves it to
        `run`, which does it while round 0's transfers travel: ~200 store inserts less before them)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            with self.timed("adopt"):
                pending()

    def view(self, r: int) -> np.ndarray:
        """The strided view of region row `r` in its array (bounds checked by numpy)."""
        v = self.sliced.views[r]
        base = self.arrays[v.array]
        return np.ndarray(v.shape, base.dtype, buffer=base, offset=v.offset, strides=v.strides)

    def flat(self, i: int) -> np.ndarray | None:
        """Array `i`'s bytes as one flat uint8 view, made once per execution (None when it is not
        C-contiguous: a flat reshape of it would be a copy)."""
        got = self._flat.get(i, False)
        if got is False:
            a = self.arrays[i]
            got = self._flat[i] = a.reshape(-1).view(np.uint8) if a.flags.c_contiguous else None
        return got

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0


def source(store: TensorStore, path: str, shape: tuple[int, ...], dtype: str, np_type: np.dtype) -> np.ndarray:
    """The src array at `path`, checked against the slice's shape and dtype (`np_type`: its numpy dtype)."""
    try:
        got = store.get(path)
    except StoreError:
        raise ExecutionError(f"src array {path} is missing") from None
    if not isinstance(got, np.ndarray) or got.shape != shape or got.dtype != np_type:
        what = f"{got.dtype}{list(got.shape)}" if isinstance(got, np.ndarray) else type(got).__name__
        raise ExecutionError(f"src array {path} is {what}, the plan reads {dtype}{list(shape)}")
    return got


def sources(store: TensorStore, sl: Sliced, job: str, tag: str) -> dict[int, np.ndarray]:
    """{slice array index: src array} of `sl` under `tag`, each checked against the slice's shape
    and dtype (`source`). Raises ExecutionError naming the first missing or mismatched array."""
    indices, paths = sl.paths(job, tag, "src")
    return {i: source(store, path, sl.shapes[i], sl.meta[i][3], sl.dtypes[i]) for i, path in zip(indices, paths)}


def src_values(store: TensorStore, job: str, tag: str, wanted: list[tuple[int, str, int, str]]) -> dict[int, Any]:
    """{op id: value} for (op id, partition, device, name) of values this host holds."""
    out = {}
    for op_id, pid, device, name in wanted:
        path = value_path(job, tag, device, pid, name)
        if not store.exists(path):
            raise ExecutionError(f"value op {op_id}: src value {path} is missing")
        out[op_id] = store.get(path)
    return out


def run(ex: Execution, store: TensorStore, peer: Callable[[], Any], endpoint: Callable[[str], Any],
        scratch: parts.Scratch, epoch: int, maps: direct.Mappings) -> int:  # fmt: skip
    """Every round of this host's slice, in order; returns the bytes it sent (`maps`: this
    agent's mappings of same-node peers' arenas, `direct`)."""
    sent = 0
    fills_and_values(ex, store)
    links, first = direct.NONE, _adopting(ex, local(ex, ex.sliced.batches.get(0, [])))
    if ex.sliced.network and not getattr(peer(), "takes_views", False):  # cma reads peers' views already
        # round 0's local copies run while the offers and answers travel
        with ex.timed("setup"), _named(f"setting up shared memory with the peers on this node ({ex.host})"):
            links = direct.setup(ex, peer(), endpoint, maps, epoch, first)
    for r in range(ex.rounds):
        work = first if r == 0 else local(ex, ex.sliced.batches.get(r, []))
        if ex.sliced.network.get(r):
            sent += network(ex, r, peer(), endpoint, scratch, epoch, work, links)
        else:
            for _ in work:
                pass
        ex.done = r + 1
    ex.adopt()  # round 0's work did, but for a failure of its own
    return sent


def fills_and_values(ex: Execution, store: TensorStore) -> None:
    """This host's fill ops, and its value ops but those `waiting` for a src value another host
    reads (`late_values`, at the commit); src values on this host are read here."""
    for region, k in ex.fills:
        with _named(f"fill of region {region} with {ex.fill_values[k]!r}"):
            ex.view(region)[...] = ex.fill_values[k]
    for op_id, device, partition, name, src_partition, src_device, literal in ex.values:
        if op_id in ex.waiting:
            continue
        with _named(f"op {op_id} (ValueOp on device {device})"):
            if src_partition is None:
                value = literal
            else:
                value = store.get(value_path(ex.job, ex.src_tag, src_device, src_partition, name))
            store.put(value_path(ex.job, ex.staging, device, partition, name), value, replace=True)


def late_values(ex: Execution, store: TensorStore, values: Mapping[int, Any]) -> None:
    """The value ops `waiting` since `run`, with `values` ({op id: src value} that other hosts
    read, passed on by the runtime with the commit). Raises ExecutionError, before writing any,
    naming ops that wait for no value or whose value is missing."""
    wrong, missing = sorted(set(values) - ex.waiting), sorted(ex.waiting - set(values))
    if wrong or missing:
        raise ExecutionError(f"value ops on {ex.host!r}: {wrong[:8]} wait for no value, {missing[:8]} got none")
    for op_id, device, partition, name, *_ in ex.values:
        if op_id in values:
            with _named(f"op {op_id} (ValueOp on device {device})"):
                store.put(value_path(ex.job, ex.staging, device, partition, name), values[op_id], replace=True)
    ex.waiting = set()


def _adopting(ex: Execution, work: Iterator[None]) -> Iterator[None]:
    """`work` (round 0's local copies), then `ex.adopt()`: the dst arrays become store leaves
    while the offers (`direct`) and the round's transfers travel, after the copies (~200 store
    inserts, ~1 CPU ms, that as the first step held back the first progress calls and so the
    rendezvous of the parts)."""
    yield from work
    ex.adopt()
    yield


def local(ex: Execution, batches: list[list[list[int]]]) -> Iterator[None]:
    """The copies within this host (region to region), a batch of about `sliced.BATCH_BYTES`
    per step: a generator, so that `network` can interleave them with the round's transfers. A
    copy between two C-contiguous regions of one shape and dtype is a copy of byte ranges (`Execution.flat`:
    ~1 µs against ~3 for two strided views and `copyto`; most copies of a plan)."""
    view, flat, views, dtypes = ex.view, ex.flat, ex.sliced.views, ex.sliced.dtypes
    for batch in batches:
        t0 = time.perf_counter()
        for row in batch:
            try:
                s, d = views[row[3]], views[row[4]]
                if s.contiguous and d.contiguous and s.shape == d.shape and dtypes[s.array] == dtypes[d.array]:
                    into, out = flat(d.array), flat(s.array)  # bounds checked here: a slice would clip
                    if into is not None and out is not None and 0 <= d.offset <= into.size - d.nbytes and 0 <= s.offset <= out.size - s.nbytes:
                        into[d.offset : d.offset + d.nbytes] = out[s.offset : s.offset + s.nbytes]
                        continue
                np.copyto(view(row[4]), view(row[3]))
            except Exception as e:
                r, message, op = row[:3]
                raise ExecutionError(f"message {message} ({ex.host} -> {ex.host}, round {r}), op {op} failed: "
                                     f"{type(e).__name__}: {e}") from e  # fmt: skip
        ex.seconds["local"] += time.perf_counter() - t0
        yield


def network(ex: Execution, r: int, peer: Any, endpoint: Callable[[str], Any], scratch: parts.Scratch,
            epoch: int, work: Iterator[None], links: direct.Links) -> int:  # fmt: skip
    """Exchange round `r`'s network parts with every peer at once; returns bytes sent. `work`
    (the round's local copies) runs while the transfers progress. Parts to `links.out` peers are
    copied into their memory first (then their `done` goes with the UCX sends), parts from
    `links.into` peers are only waited for (their `done`)."""
    todo = ex.sliced.network[r]
    sends, recvs, moved = _direct(ex, r, todo, endpoint, epoch, links)
    todo = [p for p in todo if p.peer not in (links.out if p.outgoing else links.into)]
    unpacks: list[tuple[str, list[np.ndarray], np.ndarray]] = []
    by_views = getattr(peer, "takes_views", False)  # the transport reads and writes the views themselves
    with ex.timed("views"):  # the parts' views and buffers; packing runs inside the exchange (`_packer`)
        scratch.reserve(0 if by_views else sum(p.nbytes for p in todo if not p.in_place))
        for p in todo:
            with _named(p.what):
                views = [ex.view(i) for i in p.regions]
                buffer = views if by_views else views[0] if p.in_place else scratch.take(p.nbytes)
            if p.outgoing:  # a packed part is staged: packed while the ready parts already travel
                ready = buffer if p.in_place or by_views else _packer(ex, p.what, views, buffer)
                sends.append((endpoint(p.peer), ready, (epoch << EPOCH_SHIFT) | p.tag))
            else:
                recvs.append((endpoint(p.peer), buffer, (epoch << EPOCH_SHIFT) | p.tag))
                if not p.in_place and not by_views:
                    unpacks.append((p.what, views, buffer))
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
    through = sum(p.nbytes for p in todo if p.outgoing)
    ex.sent["direct_bytes"] += moved
    ex.sent["transport_bytes"] += through
    return moved + through


def _direct(ex: Execution, r: int, todo: list, endpoint: Callable[[str], Any], epoch: int,
            links: direct.Links) -> tuple[list, list, int]:  # fmt: skip
    """Round `r`'s parts to `links.out` peers copied into their memory; returns the `done`
    control sends and receives of the round (`direct`; none in the last round) and the bytes copied."""
    sends, recvs, moved, done = [], [], 0, direct.ctl(epoch, r)
    with ex.timed("direct"):
        for p in todo:
            if p.outgoing and p.peer in links.out:
                with _named(p.what):
                    direct.copy(ex, p, links.out[p.peer][p.tag])
                moved += p.nbytes
    if r == ex.rounds - 1:  # the last round's barrier is the runtime's: it commits after every agent's run
        return sends, recvs, moved
    for h in sorted({p.peer for p in todo if p.outgoing and p.peer in links.out}):
        sends.append((endpoint(h), np.ones(1, "<i8"), done, CTL))
    for h in sorted({p.peer for p in todo if not p.outgoing and p.peer in links.into}):
        recvs.append((endpoint(h), np.zeros(1, "<i8"), done, CTL))
    return sends, recvs, moved


def _packer(ex: Execution, what: str, views: list[np.ndarray], buffer: np.ndarray) -> Callable[[], np.ndarray]:
    """A staged send's buffer maker (`UcxPeer.exchange`): packs `views` into `buffer` when called."""

    def make() -> np.ndarray:
        with ex.timed("pack"), _named(what):
            parts.pack(views, buffer)
        return buffer

    return make


@contextlib.contextmanager
def _named(what: str) -> Iterator[None]:
    """Any failure in the block re-raised as an ExecutionError naming `what`."""
    try:
        yield
    except Exception as e:
        raise ExecutionError(f"{what} failed: {type(e).__name__}: {e}") from e
