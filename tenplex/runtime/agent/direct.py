"""Network parts between agents on one machine, moved by one copy through shared memory (issue 16).

Two agents on the same node (same boot and network namespace: `Agent.connect`'s "address"
endpoints) need not pass a part's bytes through UCX: the receiver's dst arrays live in shared
memory arenas (`store.shared`, memfd), so the sender maps them (`/proc/<pid>/fd/<fd>`, checked
by inode, device, size and seals: only a memory file sealed against resizing, never a file on
disk, never shrunk under the mapping) and copies each of its regions straight into the receiver's view: one
copy, strided on both sides, no pack, no unpack, no scratch, no UCX transfer. Per execution:

1. at the start of `rounds.run`, each agent sends every same-node peer it receives parts from an
   *offer*: per region of those parts, in part order, (part tag, arena, byte offset, itemsize,
   shape, strides), or a refusal when one of them is not in an arena (mapped `.npy` files,
   arrays made one by one under a memory budget);
2. each sender maps what it was offered (`Mappings`) and answers yes or no (no: /proc not
   readable, another pid namespace, a mismatch); that peer's parts then go directly or through
   UCX as before, both ways agreed, for the whole execution. A receiver that a peer answered
   yes before marks its next offers to it *sure*: no answer travels, one wait less per
   execution, and a sender that cannot map a sure offer fails the execution, naming both
   agents, rather than fall back alone (an abort, or a new runtime, makes the receiver ask again);
3. per round, a sender copies its direct parts, then sends each such peer `done` for the round;
   a receiver ends the round only after every direct peer's `done`, so later rounds see the
   bytes, as with UCX. The last round has no `done`: the runtime commits only after every
   agent's `run` returned, every sender's copies with it (a one-round plan then has no wait
   between the agents but the offer's).

Control messages are UCX tagged messages of kind CTL (`ucx.wire`) in the execution's epoch, so
nothing of an aborted execution matches a later one. A sender keeps the mappings of the last
execution (the receiver's arena pool hands the same arenas to the next execution of a plan,
whose copies then fault in no page) and unmaps older ones; a new mapping gets its page tables
under the sender's regions filled by one call per run (`store.shared.populate_ranges`) before
the copies, instead of a page fault per page (half the CPU of a first execute's copies). An
agent's `Mappings` are unmapped when it stops. The receiver's pool may reuse an arena that a peer still maps: a peer writes only
inside an execution that offered it the arena, and every write ends before that execution's
`done`.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.store.shared import SEALS, populate_ranges
from tenplex.runtime.transport.ucx.wire import CTL

EPOCH_SHIFT = 28  # as `rounds`: a control message id is the epoch above a code
OFFER, ANSWER = (1 << EPOCH_SHIFT) - 1, (1 << EPOCH_SHIFT) - 2  # codes below: a round's `done`
HEAD, ARENA = 4, 4  # int64s of an offer's header (pid, arenas, rows, sure) and of each arena (fd, ino, dev, size)


class Links(NamedTuple):
    """How this execution moves each same-node peer's parts: `out` {peer: {part tag: [remote
    views]}} sent by a copy into the peer's memory, `into` the peers whose parts to this host
    they copy here (nothing to post for those but their `done`)."""

    out: dict[str, dict[int, list[np.ndarray]]]
    into: frozenset[str]


NONE = Links({}, frozenset())


def ctl(epoch: int, code: int) -> int:
    return (epoch << EPOCH_SHIFT) | code


def setup(ex: Any, peer: Any, endpoint: Callable[[str], Any], maps: Mappings, epoch: int, work: Iterator[None]) -> Links:
    """Steps 1 and 2 of the module doc for execution `ex`; returns its `Links`. `work` (local
    copies) runs while the messages travel, as far as they take."""
    same = {h for h in ex.peers if endpoint(h).mode == "address"}
    parts = [p for r in sorted(ex.sliced.network) for p in ex.sliced.network[r] if p.peer in same]
    into = sorted({p.peer for p in parts if not p.outgoing})
    out = sorted({p.peer for p in parts if p.outgoing})
    if not parts:
        return NONE
    mine = {(h, way): [p for p in parts if p.peer == h and p.outgoing == way] for h in same for way in (True, False)}
    offers = {h: offer(ex, mine[h, False], h in maps.mapped_by) for h in into}
    got = {h: np.zeros(capacity(ex, mine[h, True]), "<i8") for h in out}  # zeros: equal offers compare equal
    peer.exchange([(endpoint(h), offers[h], ctl(epoch, OFFER), CTL) for h in into],
                  [(endpoint(h), got[h], ctl(epoch, OFFER), CTL) for h in out], work=work, finish_work=False)  # fmt: skip
    links: dict[str, dict[int, list[np.ndarray]]] = {}
    populated = maps.populated
    for h in out:
        views = maps.views(ex, h, got[h], mine[h, True])
        if views is not None:
            links[h] = views
        elif got[h][3]:  # the peer counts on this host's copies and waits for no answer
            raise ExecutionError(f"agent {ex.host!r} cannot map the arena that agent {h!r} offered (it could before)")
    maps.keep_only()
    ex.sent["mapped_bytes"] = maps.populated - populated
    ask = [h for h in out if got[h][1] >= 0 and not got[h][3]]  # a refusal or a sure offer needs no answer
    wait = [h for h in into if offers[h][1] >= 0 and not offers[h][3]]
    heard = {h: np.zeros(1, "<i8") for h in wait}
    if ask or wait:
        answer = ctl(epoch, ANSWER)
        peer.exchange([(endpoint(h), np.array([int(h in links)], "<i8"), answer, CTL) for h in ask],
                      [(endpoint(h), heard[h], answer, CTL) for h in wait], work=work, finish_work=False)  # fmt: skip
    maps.mapped_by.update(h for h in wait if heard[h][0] == 1)
    return Links(links, frozenset(h for h in into if offers[h][1] >= 0 and (offers[h][3] or heard[h][0] == 1)))


def offer(ex: Any, parts: list, sure: bool = False) -> np.ndarray:
    """The offer (int64s, module doc) of this host's dst regions of `parts` (`sure`: asking for no
    answer), or a refusal (arena count -1) when one of them is not in a shared arena. It needs
    no store leaf (`ex.places`), so it travels while the dst arrays are made leaves (`Execution.adopt`)."""
    arenas: dict[int, int] = {}  # fd -> index
    heads: list[int] = []
    rows: list[int] = []
    for p in parts:
        for i in p.regions:
            v = ex.sliced.views[i]
            shared = ex.places.get(v.array)
            if shared is None or shared[0].fd < 0:
                return np.array([os.getpid(), -1, 0, 0], "<i8")
            arena, at = shared
            if arena.fd not in arenas:
                st = os.fstat(arena.fd)
                arenas[arena.fd] = len(arenas)
                heads += [arena.fd, st.st_ino, st.st_dev, arena.size]
            item = ex.arrays[v.array].dtype.itemsize
            rows += [p.tag, arenas[arena.fd], at + v.offset, item, len(v.shape), *v.shape, *v.strides]
    return np.array([os.getpid(), len(arenas), sum(len(p.regions) for p in parts), int(sure), *heads, *rows], "<i8")


def capacity(ex: Any, parts: list) -> int:
    """int64s of the largest offer a peer can make for `parts` (this host's outgoing parts to it)."""
    n = sum(len(p.regions) for p in parts)
    return HEAD + ARENA * n + sum(5 + 2 * len(ex.sliced.views[i].shape) for p in parts for i in p.regions)


def copy(ex: Any, part: Any, remote: list[np.ndarray]) -> None:
    """A direct part: each of this host's regions of `part` into the peer's view."""
    for i, dst in zip(part.regions, remote):
        np.copyto(dst, ex.view(i))


def _extent(offset: int, shape: tuple[int, ...], strides: tuple[int, ...], item: int) -> tuple[int, int]:
    """The byte range [start, stop) that a strided region spans (empty for an empty one)."""
    if 0 in shape:
        return offset, offset
    low = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    return low, offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + item


class Mappings:
    """A sender's mappings of its peers' arenas, {(pid, ino, dev): (mmap, bytes view)}."""

    def __init__(self) -> None:
        self.maps: dict[tuple[int, int, int], tuple[mmap.mmap, np.ndarray]] = {}
        self.used: set[tuple[int, int, int]] = set()
        self.mapped_by: set[str] = set()  # peers that answered yes to this agent's offers (`sure` ones since)
        self.populated = 0  # bytes under new mappings' regions whose page tables an execution filled
        # per peer, the last offer's views: (slice, offer bytes, mapping keys, views); a plan executed
        # again into a pooled arena gets the same offer, whose views are then not rebuilt
        self.last: dict[str, tuple[Any, bytes, list[tuple[int, int, int]], dict[int, list[np.ndarray]]]] = {}

    def views(self, ex: Any, host: str, got: np.ndarray, parts: list) -> dict[int, list[np.ndarray]] | None:
        """{part tag: [peer's view per region]} from `host`'s offer `got`; None when refused or
        not mappable here. Raises ExecutionError when the offer does not describe `parts`."""
        pid, n_arenas, n_rows, _ = (int(x) for x in got[:HEAD])
        if n_arenas < 0:
            return None
        last = self.last.get(host)
        if last is not None and last[0] is ex.sliced and last[1] == got.tobytes() and all(k in self.maps for k in last[2]):
            self.used.update(last[2])
            return last[3]
        out = self._views(ex, host, got, parts, pid, n_arenas, n_rows)
        if out is not None:
            keys = [(pid, int(got[HEAD + ARENA * k + 1]), int(got[HEAD + ARENA * k + 2])) for k in range(n_arenas)]
            self.last[host] = (ex.sliced, got.tobytes(), keys, out)
        return out

    def _views(self, ex: Any, host: str, got: np.ndarray, parts: list, pid: int, n_arenas: int,
               n_rows: int) -> dict[int, list[np.ndarray]] | None:  # fmt: skip
        arenas, new = [], set()
        for k in range(n_arenas):
            fd, ino, dev, size = (int(x) for x in got[HEAD + ARENA * k : HEAD + ARENA * (k + 1)])
            fresh = (pid, ino, dev) not in self.maps
            mapped = self._map(pid, fd, ino, dev, size)
            if mapped is None:
                return None
            arenas.append(mapped)
            if fresh:
                new.add(k)
        written: dict[int, list[tuple[int, int]]] = {k: [] for k in new}  # byte ranges this host writes
        at = HEAD + ARENA * n_arenas
        out: dict[int, list[np.ndarray]] = {}
        for p in parts:
            out[p.tag] = []
            for i in p.regions:
                mine = ex.view(i)
                tag, arena, offset, item, ndim = (int(x) for x in got[at : at + 5])
                shape, strides = (
                    tuple(got[at + 5 : at + 5 + ndim].tolist()),
                    tuple(got[at + 5 + ndim : at + 5 + 2 * ndim].tolist()),
                )
                at += 5 + 2 * ndim
                if (tag, item, shape) != (p.tag, mine.dtype.itemsize, mine.shape) or not 0 <= arena < n_arenas:
                    raise ExecutionError(f"{p.what}: peer {host!r} offered region (tag {tag}, itemsize {item}, shape "
                                         f"{list(shape)}), this host sends {mine.dtype}{list(mine.shape)} (tag {p.tag})")  # fmt: skip
                try:
                    out[p.tag].append(
                        np.ndarray(shape, mine.dtype, buffer=arenas[arena], offset=offset, strides=strides)
                    )
                except (TypeError, ValueError) as e:
                    raise ExecutionError(f"{p.what}: peer {host!r} offered a region outside its arena: {e}") from None
                if arena in written:
                    written[arena].append(_extent(offset, shape, strides, item))
        if sum(len(p.regions) for p in parts) != n_rows:
            raise ExecutionError(
                f"peer {host!r} offered {n_rows} regions, this host sends it {sum(len(p.regions) for p in parts)}"
            )
        for k, ranges in written.items():  # a new mapping: its page tables filled at once, not a fault per page
            populate_ranges(arenas[k], ranges)
            self.populated += sum(stop - start for start, stop in ranges)
        return out

    def _map(self, pid: int, fd: int, ino: int, dev: int, size: int) -> np.ndarray | None:
        key = (pid, ino, dev)
        if key in self.maps and self.maps[key][1].size < size:
            self._unmap(key)
        if key not in self.maps:
            try:
                f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                st = os.fstat(f)
                if (st.st_ino, st.st_dev) != (ino, dev) or st.st_size < size or size <= 0:
                    return None  # not the peer's arena (another pid namespace) or nothing to map
                if fcntl.fcntl(f, fcntl.F_GET_SEALS) & SEALS != SEALS:
                    return None  # only a sealed memory file: never a file on disk, never shrunk under the mapping
                m = mmap.mmap(f, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError:
                return None
            finally:
                os.close(f)
            self.maps[key] = (m, np.frombuffer(m, np.uint8, size))
        self.used.add(key)
        return self.maps[key][1]

    def premap(self, arenas: list[list[int]]) -> int:
        """Map ahead the peers' pooled arenas `arenas` ([pid, fd, inode, device, size] each, from
        `Runtime.reserve`) with their page tables filled, so that the first execution into one
        maps and populates nothing; returns the bytes mapped. An arena that this process cannot
        map as described (another node or pid namespace) is skipped. Kept until an execution's
        offers name other arenas (`keep_only`)."""
        mapped = 0
        for pid, fd, ino, dev, size in arenas:
            key = (pid, ino, dev)
            if key in self.maps:
                continue
            view = self._map(pid, fd, ino, dev, size)
            self.used.discard(key)  # not named by an offer yet
            if view is not None:
                populate_ranges(view, [(0, size)])
                mapped += size
        return mapped

    def keep_only(self) -> None:
        """Unmap every mapping that the offers since the last call did not name."""
        for key in set(self.maps) - self.used:
            self._unmap(key)
        self.used = set()

    def _unmap(self, key: tuple[int, int, int]) -> None:
        for host in [h for h, last in self.last.items() if key in last[2]]:
            del self.last[host]  # its views map `key`
        m, view = self.maps.pop(key)
        del view
        with contextlib.suppress(BufferError):  # a view still maps it: unmapped when the last one goes
            m.close()

    def forget_peers(self) -> None:
        """Ask every peer for an answer again (after a failed execution or with a new runtime)."""
        self.mapped_by.clear()

    def close(self) -> None:
        self.forget_peers()
        for key in list(self.maps):
            self._unmap(key)
