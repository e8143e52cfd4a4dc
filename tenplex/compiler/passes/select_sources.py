"""`select-sources`: choose where each needed region is read from.

Locality first: a holder on the dst device (device class), else on the dst host (host class,
least-loaded device first), else the network. Network regions are gathered per dst host and cut
into disjoint *atoms*; each atom crosses the network once, lands on one dst device and is
forwarded to the host's other devices that need it (`src_side="dst"` copies behind an order
edge), so network bytes equal the per-host lower bound. The sending host is the least-loaded
holder host (largest atoms first), so the busiest NIC sends as little as possible. Transfers
between devices larger than `max_message_bytes` are cut into row-major chunks.

With `options.baseline == "reference"`, sources are chosen as the reference Tenplex does: every
dst device pulls every region from the first replica (DP rank 0) of the first holder, with no
locality and no deduplication. Such plans still verify; they only move more bytes.
"""

from __future__ import annotations

from collections import Counter
from itertools import count as numbers_from
from itertools import filterfalse
from operator import add

import attrs
import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.diff import ValueNeed
from tenplex.compiler.holders import holder_rows
from tenplex.compiler.ops import Holder, Need, ValueOp
from tenplex.compiler.passes.atoms import Atoms, Far
from tenplex.compiler.passes.choice import devices as least_loaded
from tenplex.compiler.passes.choice.hosts import HolderHosts, least_sent_hosts
from tenplex.compiler.passes.local import local_copies
from tenplex.compiler.program import Program
from tenplex.compiler.table import I64, OpTable, pad
from tenplex.ir.box import Box, split_box
from tenplex.ir.errors import CompileError


@attrs.frozen
class SelectSources:
    name = "select-sources"
    requires = frozenset({"lowered"})
    provides = frozenset({"sources"})

    def apply(self, program: Program) -> Program:
        state = _State(program)
        items = [op for _, op in program.graph.items()]
        needs = [op for op in items if isinstance(op, Need)]
        if items[: len(needs)] != needs:  # op ids: the needs' copies come first
            raise CompileError("the lowered graph lists a fill or value need before a need")
        remote = Far.empty()
        if program.options.baseline == "reference":
            for need in needs:
                for d in need.dst_devices:
                    state.reference_copy(need, d)
            state.local = np.array(state.rows, I64).reshape(-1, 8)
        else:
            state.local, remote = local_copies(state, needs)
        for op in items[len(needs) :]:
            if isinstance(op, ValueNeed):
                base = state.next_id()
                state.others.extend((base + i, v) for i, v in enumerate(state.value_ops(op)))
            else:
                state.others.append((state.next_id(), op))
        table, edges = state.table(Atoms(state, remote))
        return attrs.evolve(program, graph=None, table=table, edges=edges)


class _State:
    """Load counters, lookup tables and the copies chosen so far (rows of ints: tensor, box,
    src device, sub-tensor and piece, dst device, sub-tensor and piece; all read the src state)."""

    def __init__(self, program: Program):
        self.p = program
        self.host = {d.id: d.host for d in program.topology.devices}
        self.host_rank = {h: i for i, h in enumerate(program.topology.hosts)}
        self.size = dict(program.dst.itemsizes)  # per dst tensor, in dst order
        self.tensor_ix = {t.name: i for i, t in enumerate(program.dst.tensors)}
        # src sub-tensors first, in the src PTC's order: `HolderRows` number them so (ids are unique in a PTC)
        pieces = program.pieces
        src_ids = pieces.src.ids if pieces is not None else [s.id for s in program.src.subtensors]
        self.dst_ids = pieces.dst.ids if pieces is not None else [s.id for s in program.dst.subtensors]  # in dst order
        self.sid_ix = dict(zip(src_ids, range(len(src_ids))))
        self.sid_ix.update(zip(filterfalse(self.sid_ix.__contains__, self.dst_ids), numbers_from(len(src_ids))))
        self.sent_device: Counter[int] = Counter()
        self.box_ids: dict[int, int] = {}
        self.value_holders: dict[int, tuple] = {}
        self.boxes: list[Box] = []
        self.rows: list[tuple[int, ...]] = []  # copies being built one at a time
        self.local = np.zeros((0, 8), I64)  # the copies within a host (or all, for the reference baseline)
        self.others: list[tuple[int, object]] = []  # (op id, fill or value op)

    def next_id(self) -> int:
        return len(self.local) + len(self.others)

    def box_id(self, box: Box) -> int:
        """The box's index in `boxes`, by object (`boxes` keeps them alive for id())."""
        i = self.box_ids.get(id(box))
        if i is None:
            i = self.box_ids[id(box)] = len(self.boxes)
            self.boxes.append(box)
        return i

    def copy(self, need: Need, device: int, holder: Holder, box: Box) -> None:
        """The copy of `box` of `need` onto `device` from `holder`, cut into row-major chunks
        when it crosses devices and exceeds the message size limit."""
        t, ds, sid = self.tensor_ix[need.tensor], self.sid_ix[need.dst_subtensor], self.sid_ix[holder.subtensor]
        limit = max(1, self.p.options.max_message_bytes // self.size[need.tensor])
        chunks = [box] if holder.device == device or box.volume <= limit else split_box(box, limit)
        for b in chunks:
            self.rows.append((t, self.box_id(b), holder.device, sid, holder.piece, device, ds, need.dst_piece))

    def reference_copy(self, need: Need, device: int) -> None:
        first = need.holders[0].subtensor, need.holders[0].piece
        dp0 = min(self.p.src.devices_of_subtensor(first[0]))
        self.copy(need, device, Holder(dp0, *first), need.box)

    def value_ops(self, vn: ValueNeed) -> list[ValueOp]:
        if not vn.holders:
            return [ValueOp(d, vn.dst_partition, vn.name, value=vn.value) for d in vn.dst_devices]
        on_device, on_host = self.value_index(vn.holders)
        out = []
        for d in vn.dst_devices:
            dev, part = on_device.get(d) or on_host.get(self.host[d]) or vn.holders[0]
            out.append(ValueOp(d, vn.dst_partition, vn.name, dev, part))
        return out

    def value_index(self, holders: tuple[tuple[int, str], ...]) -> tuple[dict, dict]:
        """The first holder per device and per host (holders sorted; cached: value needs of
        one name share their tuple)."""
        found = self.value_holders.get(id(holders))
        if found is None:
            on_device, on_host = {}, {}
            for dev, part in holders:
                on_device.setdefault(dev, (dev, part))
                on_host.setdefault(self.host[dev], (dev, part))
            found = self.value_holders[id(holders)] = (on_device, on_host, holders)  # keeps `holders` alive for id()
        return found[0], found[1]

    def sources(self, sets: HolderHosts, which: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each atom's landing source, in the order given (holders `which[i]` of `sets`): the
        least-sent holder host, and on it the least-loaded holder device (bytes it sent so
        far, local copies included; ties by holder); (device, sub-tensor id, piece) arrays.
        Atoms of one holder set and host share their candidates (looked up once per pair)."""
        host = least_sent_hosts(which, sets.members, nbytes, sets.n)
        pair, _, inverse = keysort.unique_first(which * sets.n + host)
        at = np.searchsorted(sets.keys, pair)
        inverse = inverse.reshape(-1)
        ints = sets.rows[sets.order[sets.first[at]]][inverse]
        multi = np.flatnonzero(sets.count[at][inverse] > 1)
        if len(multi):  # the rest hold the atom on one device of that host: no choice
            ints[multi] = self.least_loaded(sets, pair[inverse[multi]], multi, ints[:, 0], nbytes)
        return ints[:, 0], ints[:, 1], ints[:, 2]

    def least_loaded(self, sets: HolderHosts, keys: np.ndarray, multi: np.ndarray, device: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Rows (device, sub-tensor id, piece) of the least-loaded holder on the chosen host of
        each atom of `multi` (holders of (set, host) key `keys[i]`), one at a time: bytes its
        device sent so far (local copies, the single-holder atoms before it by `device`, the
        atoms of `multi` before it); ties by holder. Candidates are read once per distinct key
        as rows, in holder order (sets are sorted), so the first least-loaded is the least."""
        distinct, _, which = keysort.unique_first(keys)
        at = np.searchsorted(sets.keys, distinct)
        count = sets.count[at]
        bounds = np.concatenate(([0], np.cumsum(count)))
        flat = sets.order[keysort.ranges(sets.first[at], count)]
        rows = sets.rows[flat]
        lens = count[which]
        at_key = keysort.ranges(bounds[:-1][which], lens)
        before = _sent_before(device, nbytes, multi, rows[at_key, 0], lens)
        sent = [0] * (int(rows[:, 0].max(initial=0)) + 1)  # per device: bytes sent so far
        sent.extend([0] * (max(self.sent_device, default=0) + 1 - len(sent)))
        for d, v in self.sent_device.items():
            sent[d] = v
        host = keys % sets.n
        if least_loaded.steps(host) * 8 <= len(multi):  # hosts take turns in few steps (1024 GPUs: 152 for 9,280)
            return rows[least_loaded.by_steps(host, which, bounds, rows[:, 0], before, nbytes[multi], sent)]
        before = before.tolist()
        devices, starts, cut = rows[:, 0].tolist(), bounds.tolist(), np.concatenate(([0], np.cumsum(lens))).tolist()
        candidates = [devices[a:b] for a, b in zip(starts[:-1], starts[1:])]  # per distinct key
        chosen = []
        for x, a, b, size in zip(which.tolist(), cut[:-1], cut[1:], nbytes[multi].tolist()):
            ds = candidates[x]
            loads = list(map(add, before[a:b], map(sent.__getitem__, ds)))
            i = loads.index(min(loads))
            chosen.append(starts[x] + i)
            sent[ds[i]] += size
        return rows[chosen]

    def table(self, atoms: Atoms) -> tuple[OpTable, np.ndarray]:
        """The pass's copies as columns: the local ones in need order, then the fills and
        values, then each atom's landing copy and forwards, largest atoms first."""
        lo, hi, nd = pad(self.boxes)
        volume = np.prod(hi - lo, axis=1)
        itemsize = np.array([self.size[t] for t in self.tensor_ix], I64)
        order = atoms.order(volume, itemsize, lo, nd, hi)
        nbytes = (volume[atoms.box] * itemsize[atoms.tensor])[order]
        host_of = np.zeros(max(self.host) + 1, I64)
        host_of[list(self.host)] = [self.host_rank[h] for h in self.host.values()]
        sets = HolderHosts(*holder_rows(atoms.sets, self.sid_ix), host_of, len(self.host_rank))
        holders = self.sources(sets, atoms.holders[order], nbytes)
        first = self.next_id()
        cols, edges = atoms.copies(order, first, holders)
        local = self.local
        names = ("tensor", "box", "src_dev", "src_sid", "src_piece", "dst_dev", "dst_sid", "dst_piece")
        merged = np.empty((len(names), len(local) + len(cols["tensor"])), I64)  # rows: contiguous columns
        merged[:, : len(local)] = local.T  # one pass over the rows, not eight strided ones
        for j, k in enumerate(names):
            merged[j, len(local) :] = cols[k]
        forward = np.concatenate((np.zeros(len(local), bool), cols["forward"]))
        others = tuple(self.others)
        is_copy = np.ones(first + len(forward) - len(local), bool)
        is_copy[np.array([i for i, _ in others], I64)] = False
        table = OpTable(len(is_copy), np.flatnonzero(is_copy), tuple(self.tensor_ix), tuple(self.sid_ix),
                        tuple(self.boxes), forward=forward, others=others, **dict(zip(names, merged)))  # fmt: skip
        return table, edges


def _sent_before(device: np.ndarray, nbytes: np.ndarray, multi: np.ndarray, candidates: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Per atom of `multi` and device of its candidates (`lens[i]` devices of `candidates`
    each, in turn): bytes that the atoms before it which had a single candidate (`device`)
    sent from that device."""
    n = len(device)
    single = np.ones(n, bool)
    single[multi] = False
    keys = device[single] * n + np.flatnonzero(single)  # by device, then position
    order = keysort.argsort(keys)
    keys, cum = keys[order], np.concatenate(([0], np.cumsum(nbytes[single][order])))
    at = np.repeat(multi, lens)
    return cum[np.searchsorted(keys, candidates * n + at)] - cum[np.searchsorted(keys, candidates * n)]
