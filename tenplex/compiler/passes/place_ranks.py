"""`place-ranks`: permute dst ranks over the dst devices to keep the most data in place.

A dst device is a *slot* carrying its partitions. The pass moves slots in two levels so that the
launcher's host structure survives: first *blocks* of b consecutive slots of a host (b divides
the host's slot count; b = all of them moves whole hosts, smaller b moves e.g. TP groups; a
block never splits a group of model-parallel peers, so TP stays inside a host) onto
block positions of hosts with as many dst devices, maximizing bytes already on the host; then,
inside each host, slots onto devices, maximizing bytes already on the device. Both levels are
assignment problems (`tenplex.compiler.assignment`: scipy's solver ported, answer for answer);
the identity wins ties, and among block sizes the largest with the best score wins. The result is kept only when it lowers the exact
network lower bound, or keeps it and leaves more bytes on their device, so the pass never makes
a plan move more bytes.
"""

from __future__ import annotations

from collections import defaultdict

import attrs
import numpy as np

from tenplex.compiler.assignment import linear_sum_assignment
from tenplex.compiler.cost import Held, host_lower_bounds
from tenplex.compiler.pieces import Codes, Pieces, PTCPieces
from tenplex.compiler.program import Program
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation
from tenplex.ir.sweep import overlapping_pairs


@attrs.frozen
class PlaceRanks:
    name = "place-ranks"
    requires = frozenset()
    provides = frozenset({"placed"})

    def apply(self, program: Program) -> Program:
        src, dst, topo = program.src, program.dst, program.topology
        pieces = program.pieces or Pieces.read(src, dst)
        w = _Weights(src, dst, topo, pieces)
        by_host: dict[str, list[int]] = defaultdict(list)
        for d in w.slots:
            by_host[topo.host_of(d)].append(d)
        peers = _peer_groups(dst, {d: topo.host_of(d) for d in w.slots}, pieces.dst)
        same_size: dict[int, list[str]] = defaultdict(list)
        for h, ds in by_host.items():
            same_size[len(ds)].append(h)
        to_host: dict[int, str] = {}
        for hosts in same_size.values():
            to_host |= _place_blocks(hosts, by_host, w, peers)
        device_map: dict[int, int] = {}
        solved: dict[tuple, list[int]] = {}  # hosts alike (DP replicas) have equal weights: 5 of 97 at 1024 GPUs
        for h, ds in by_host.items():
            mine = sorted(s for s, t in to_host.items() if t == h)
            targets = sorted(ds)
            cols = _assign(w.on_devices(mine, targets), solved)
            device_map |= {s: targets[c] for s, c in zip(mine, cols)}
        moved = Allocation({pid: tuple(device_map[d] for d in devs) for pid, devs in dst.allocation.items})
        held = Held(pieces)  # shared by both calls
        keep = host_lower_bounds(src, dst, held=held)
        placed = host_lower_bounds(src, dst, moved, held=held) if moved != dst.allocation else keep
        in_place = sum(w.on_device(d, d) for d in w.slots), sum(w.on_device(d, device_map[d]) for d in w.slots)
        if (sum(placed.values()), -in_place[1]) < (sum(keep.values()), -in_place[0]):
            return attrs.evolve(program, dst=dst.with_allocation(moved), lower_bounds=placed)
        return attrs.evolve(program, lower_bounds=keep)


class _Weights:
    """Bytes of dst slots' partitions that src devices and hosts already hold."""

    def __init__(self, src: PTC, dst: PTC, topo, pieces: Pieces):
        self.shared = _shared_bytes(src, dst, pieces)  # dst partition -> {src partition: bytes}
        self.slots = dst.allocation.by_device  # dst device -> its partitions
        self.src_hosts = {q: {topo.host_of(e) for e in devs} for q, devs in src.allocation.items}
        self.src_on = src.allocation.by_device  # src device -> its partitions
        self.by_parts: dict[frozenset[str], dict[str, int]] = {}
        self.matrices: dict[tuple, np.ndarray] = {}

    def on_devices(self, slots: list[int], devices: list[int]) -> np.ndarray:
        """`on_device` of each slot (rows) and device (columns), as floats. Cached by the slots'
        partitions and the devices' src partitions, all it depends on: hosts alike (DP
        replicas of a stage) hold the same ones."""
        key = (tuple(self.slots[s] for s in slots), tuple(self.src_on.get(e, ()) for e in devices))
        out = self.matrices.get(key)
        if out is None:
            out = self.matrices[key] = np.array([[self.on_device(s, e) for e in devices] for s in slots], dtype=float)
        return out

    def on_device(self, slot: int, device: int) -> int:
        """Bytes of the slot's partitions that `device` holds in src (looked up per src
        partition on the device, not by scanning every partition sharing bytes with them)."""
        return sum(self.shared[p].get(q, 0) for p in self.slots[slot] for q in self.src_on.get(device, ()))

    def on_hosts(self, block: tuple[int, ...]) -> dict[str, int]:
        """host -> bytes of the block's partitions it holds (a partition on several slots counts
        once). Cached per set of partitions: DP replicas of a stage hold the same set (12 sets
        for 384 blocks at 4096 GPUs). Callers only read the dict."""
        parts = frozenset(p for s in block for p in self.slots[s])
        out = self.by_parts.get(parts)
        if out is None:
            count: dict[str, int] = defaultdict(int)
            for p in parts:
                for q, b in self.shared[p].items():
                    for h in self.src_hosts[q]:
                        count[h] += b
            out = self.by_parts[parts] = dict(count)  # a plain dict: a read of a missing host adds nothing
        return out


def _peer_groups(dst: PTC, host: dict[int, str], pieces: PTCPieces) -> dict[int, int]:
    """slot -> its group: slots of one host holding *different* pieces of one tensor are
    model-parallel peers (a TP group, ZeRO shards) and must move together, so TP never ends up
    spanning hosts. Replicas (equal pieces) and pipeline stages (other tensors) stay apart.
    Only which slots share a group matters (the ids are representatives). Whether partitions
    conflict depends only on them, so hosts holding the same partitions (DP replicas) share
    the work."""
    parent = {d: d for d in host}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    on_host: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for pid, devs in dst.allocation.items:
        for d in devs:
            on_host[host[d]][pid].append(d)
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for parts in on_host.values():
        key = tuple(sorted(parts))
        if key not in groups:
            groups[key] = _conflicting(key, pieces.partitions)
        for group in groups[key]:
            first, *rest = [d for pid in group for d in parts[pid]]
            for d in rest:
                parent[find(d)] = find(first)
    return {d: find(d) for d in host}


def _conflicting(parts: tuple[str, ...], rows: dict[str, list[tuple[str, Codes]]]) -> list[list[str]]:
    """Groups of `parts` (partitions on one host) whose devices are peers: a tensor that they
    hold in two or more layouts (codes: tuples of global box numbers) joins all its holders,
    transitively. `rows`: each partition's (tensor, codes), read once here: a tensor is in two
    or more layouts iff a row's codes differ from its first row's, and its holders are the
    partitions in order of their first row of it (a partition's rows are visited together)."""
    by_tensor: dict[str, list] = {}  # tensor -> [its first codes, whether another differs, holders]
    for pid in parts:
        for tensor, codes in rows[pid]:
            t = by_tensor.get(tensor)
            if t is None:
                by_tensor[tensor] = [codes, False, [pid]]
                continue
            if codes != t[0]:
                t[1] = True
            if t[2][-1] != pid:
                t[2].append(pid)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for _, several, holders in by_tensor.values():
        if several:
            root = find(holders[0])
            for pid in holders[1:]:
                if find(pid) != root:
                    parent[find(pid)] = root
    out: dict[str, list[str]] = defaultdict(list)
    for pid in parent:
        out[find(pid)].append(pid)
    return list(out.values())


def _splits_no_group(blocks: list[tuple[int, ...]], peers: dict[int, int]) -> bool:
    seen: dict[int, int] = {}
    for i, block in enumerate(blocks):
        for s in block:
            if seen.setdefault(peers[s], i) != i:
                return False
    return True


def _place_blocks(hosts: list[str], by_host: dict[str, list[int]], w: _Weights, peers: dict[int, int]) -> dict[int, str]:
    """slot -> host it moves to, for hosts with equal slot counts; the best block size that
    keeps every peer group in one block wins (whole hosts always do)."""
    n = len(by_host[hosts[0]])
    best: tuple[float, dict[int, str]] | None = None
    for b in sorted((b for b in range(1, n + 1) if n % b == 0), reverse=True):
        blocks = [tuple(sorted(by_host[h])[i : i + b]) for h in hosts for i in range(0, n, b)]
        if b < n and not _splits_no_group(blocks, peers):
            continue
        targets = [h for h in hosts for _ in range(0, n, b)]
        weights = [w.on_hosts(block) for block in blocks]
        matrix = np.array([[wt.get(h, 0) for h in targets] for wt in weights], dtype=float)
        cols = _assign(matrix)
        score = float(matrix[np.arange(len(blocks)), cols].sum())
        if best is None or score > best[0]:
            best = (score, {s: targets[c] for block, c in zip(blocks, cols) for s in block})
    return best[1] if best else {}


def _assign(weights: np.ndarray, solved: dict[tuple, list[int]] | None = None) -> list[int]:
    """Max-weight perfect assignment rows -> columns; the identity wins ties. `solved`: the
    answers to weights seen before, by value (the solver is deterministic)."""
    if weights.size == 0:
        return []
    if solved is not None:
        key = (weights.shape, weights.tobytes())
        if key not in solved:
            solved[key] = _assign(weights)
        return solved[key]
    scale = max(1.0, float(weights.max()) / 1e9)  # keep the tie-break bonus above float precision
    bonus = 0.5 / len(weights)
    rows, cols = linear_sum_assignment(weights / scale + bonus * np.eye(len(weights)), maximize=True)
    return [int(c) for _, c in sorted(zip(rows, cols))]


def _shared_bytes(src: PTC, dst: PTC, pieces: Pieces) -> dict[str, dict[str, int]]:
    """dst partition -> {src partition: bytes of the dst partition that it holds}. Overlaps
    are found between distinct boxes (replicas of a box share one), once per layout (tensors
    alike have the same dst and src boxes). Each overlap adds its bytes to every (dst, src)
    partition pair of its two boxes. Tensors with the same runs on both sides (`_runs`: a
    stage's weights and optimizer states of one shape) have the same overlaps, so their
    itemsizes are summed per pair of runs first and each overlap's bytes added once per pair
    (integers: any order gives the same sums); the bytes are summed per pair of partition
    runs and spread over the partitions once per distinct pair, keys in order of first
    appearance tensor by tensor (so each dict gets its keys in the order the overlaps first
    reach them)."""
    of_a, runs_a = _runs(pieces.dst, pieces.boxes)
    of_b, runs_b = _runs(pieces.src, pieces.boxes)
    layouts: dict[tuple, list[tuple[int, int, int]]] = {}  # box numbers of both -> overlaps
    alike: dict[tuple[int, int], list] = {}  # runs of both -> [(run pair, volume) per overlap, summed itemsize]
    per_runs: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
    for meta in dst.tensors:
        k = (of_a[meta.name], of_b.get(meta.name, -1))
        entry = alike.get(k)
        if entry is None:
            (codes_a, a), (codes_b, b) = runs_a[k[0]], runs_b[k[1]] if k[1] >= 0 else ((), [])
            overlaps = layouts.get((codes_a, codes_b))
            if overlaps is None:
                boxes_a, boxes_b = [r[0] for r in a], [r[0] for r in b]
                overlaps = layouts[codes_a, codes_b] = [(i, j, boxes_a[i].overlap_volume(boxes_b[j])) for i, j in overlapping_pairs(boxes_a, boxes_b)]
            entry = alike[k] = [[((a[i][1], b[j][1]), volume) for i, j, volume in overlaps], 0]
            for pair, _ in entry[0]:
                per_runs.setdefault(pair, 0)
        entry[1] += dst.itemsize(meta.name)
    for overlaps, size in alike.values():
        for pair, volume in overlaps:
            per_runs[pair] += volume * size
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (parts_a, parts_b), nbytes in per_runs.items():
        for p in parts_a:
            row = out[p]
            for q in parts_b:
                row[q] += nbytes
    return out


def _runs(pieces: PTCPieces, boxes: list[Box]) -> tuple[dict[str, int], list[tuple[tuple[int, ...], list[tuple[Box, tuple[str, ...]]]]]]:
    """(tensor -> the number of its runs; per number the global box numbers and per box (in
    sub-tensor order) the box and the partition of each piece with that box, repeated per
    piece). Tensors with equal partitions and codes per sub-tensor (`Pieces`: read once)
    share a number, so each distinct layout is walked once."""
    number: dict[tuple, int] = {}
    of: dict[str, int] = {}
    out: list[tuple[tuple[int, ...], list[tuple[Box, tuple[str, ...]]]]] = []
    for tensor, (_, pids, codes) in pieces.tensors.items():
        k = number.get((pids, codes))
        if k is None:
            k = number[pids, codes] = len(out)
            runs: dict[int, list] = {}
            for pid, cs in zip(pids, codes):
                for c in cs:
                    run = runs.get(c)
                    if run is None:
                        runs[c] = [pid]
                    else:
                        run.append(pid)
            out.append((tuple(runs), [(boxes[c], tuple(run)) for c, run in runs.items()]))
        of[tensor] = k
    return of, out
