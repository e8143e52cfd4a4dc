"""Per-host slices of a plan (`tenplex.slice/1`): each agent gets only what it runs, in a compact
binary form that it decodes without parsing a plan or a PTC.

`host_slices(plan, src, dst, hosts)` reads only the public `Plan` (ops, messages, rounds and the
allocation) and the two PTCs. A slice names this host's arrays (`arrays`: src arrays it reads,
dst arrays it creates) and describes every region it touches as a strided view of one of them,
in elements: (array, offset, ndim, shape..., strides...). Its work, bucketed by round, is in
int64 tables (little-endian bytes, row-major; see docs/formats.md):

- `regions` [n, 3 + 2D]: array index, element offset, ndim, shape (D), strides (D), padded;
- `fills` [n, 2]: region, index into `fill_values`;
- `copies` [n, 5]: round, message id, op id, src region, dst region (messages within the host);
- `parts` [n, 8]: round, peer index, outgoing (1) or not (0), tag, bytes, first and count of
  its rows in `part_regions`, message id; `part_regions` [n, 2]: region on this side, op id.

A network message becomes *parts*, each one UCX message with no header: an op of at least
`SINGLE_MIN` bytes whose region is contiguous on either side travels alone (straight from the
src view or into the dst view where contiguous), the other ops packed back to back in op order
in one part. Sender and receiver get the same part list (same order, tags, bytes) because both
slices come from this one pass; a part's tag is its index in the plan's parts (< 2**28).
Value ops stay as records: `values` [op id, dst device, dst partition, name, src partition, src
device, literal] of those whose dst is on this host (a src value on this host is read here);
`gives` [op id, src partition, src device, name, dst host] of those copying a src value this host
holds to another host (the runtime passes those on).
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Message, Plan
from tenplex.ir.box import Box
from tenplex.ir.errors import IRError
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import Piece, SubTensor

FORMAT = "tenplex.slice/1"
SINGLE_MIN = 64 << 10  # smaller ops are packed: one UCX message each would cost more than a copy
MAX_PARTS = 1 << 28
TABLES = {"regions": None, "fills": 2, "copies": 5, "parts": 8, "part_regions": 2}  # row widths (regions: 3 + 2D)

__all__ = ["FORMAT", "SINGLE_MIN", "TABLES", "c_contiguous", "host_slices", "region_of"]


@functools.lru_cache(maxsize=4096)
def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, n = [], 1
    for e in reversed(shape):
        out.append(n)
        n *= e
    return tuple(reversed(out))


def region_of(local_shape: Sequence[int], piece: Piece, box: Box) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(element offset, shape, element strides) of global `box` (inside `piece`) in a C-ordered
    local array of `local_shape`: the view `arrays.region` takes, as numbers."""
    if not piece.global_box.contains(box):
        raise IRError(f"region {box} is outside piece {piece.global_box}")
    local = c_strides(tuple(local_shape))
    base = sum(a * s for a, s in zip(piece.local_box.start, local))
    strides = c_strides(piece.global_box.shape) if piece.flat else local
    return base + sum((a - g) * s for a, g, s in zip(box.start, piece.global_box.start, strides)), box.shape, strides


def c_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a view of `shape` with element `strides` is one C-ordered run (numpy's flag)."""
    expected = 1
    for e, s in zip(reversed(shape), reversed(strides)):
        if e != 1 and s != expected:
            return False
        expected *= e
    return True


class _Slice:
    """One host's slice being built: its arrays and tables."""

    def __init__(self, host: str):
        self.host = host
        self.arrays: list[list[Any]] = []
        self.index: dict[tuple[str, str, int], int] = {}
        self.regions: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
        self.tables: dict[str, list[int]] = {name: [] for name in TABLES if name != "regions"}
        self.peers: dict[str, int] = {}
        self.fill_values: list[float] = []
        self.values: list[list[Any]] = []
        self.gives: list[list[Any]] = []

    def array(self, side: str, ptc: PTC, sid: str, device: int) -> int:
        key = (side, sid, device)
        if key not in self.index:
            st = ptc.subtensor_map[sid]
            self.index[key] = len(self.arrays)
            self.arrays.append([side, sid, device, ptc.tensor_map[st.tensor].dtype, list(st.shape)])
        return self.index[key]

    def region(self, side: str, ptc: PTC, st: SubTensor, device: int, piece: int, box: Box) -> int:
        at, shape, strides = region_of(st.shape, st.pieces[piece], box)
        self.regions.append((self.array(side, ptc, st.id, device), at, shape, strides))
        return len(self.regions) - 1

    def peer(self, host: str) -> int:
        return self.peers.setdefault(host, len(self.peers))

    def encode(self, rounds: int) -> dict[str, Any]:
        ndim = max((len(s) for _, _, s, _ in self.regions), default=0)
        regions = array("q")
        for a, at, shape, strides in self.regions:
            pad = (0,) * (ndim - len(shape))
            regions.extend((a, at, len(shape), *shape, *pad, *strides, *pad))
        out = {"format": FORMAT, "host": self.host, "rounds": rounds, "ndim": ndim, "arrays": self.arrays,
               "peers": sorted(self.peers, key=self.peers.__getitem__), "fill_values": self.fill_values,
               "values": self.values, "gives": self.gives, "regions": _bytes(regions)}  # fmt: skip
        out.update({name: _bytes(array("q", rows)) for name, rows in self.tables.items()})
        return out


def _bytes(a: array) -> bytes:
    if a.itemsize != 8:  # pragma: no cover - 'q' is 8 bytes on every platform CPython supports
        raise IRError("array('q') is not 8 bytes here")
    return a.tobytes() if _LITTLE else _swapped(a)


def _swapped(a: array) -> bytes:  # pragma: no cover - big-endian hosts only
    b = array("q", a)
    b.byteswap()
    return b.tobytes()


_LITTLE = array("H", [1]).tobytes() == b"\x01\x00"


def host_slices(plan: Plan, src: PTC, dst: PTC, hosts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{host: its slice} for every host in `hosts` (see the module docstring).

    Raises: IRError when an op names a device of no host in `hosts`, or the plan has more parts than tags."""
    dst = dst.with_allocation(plan.allocation)
    host_of = src.topology.union(dst.topology).host_of
    slices = {h: _Slice(h) for h in hosts}
    for st in dst.subtensors:
        for d in dst.devices_of_subtensor(st.id):
            _of(slices, host_of(d), "dst device").array("dst", dst, st.id, d)
    for i, op in enumerate(plan.ops):
        if isinstance(op, FillOp):
            s = _of(slices, host_of(op.dst_device), f"fill op {i}")
            st = dst.subtensor_map[op.dst_subtensor]
            a = s.array("dst", dst, st.id, op.dst_device)
            s.regions.append((a, sum(x * y for x, y in zip(op.box.start, c_strides(st.shape))), op.box.shape, c_strides(st.shape)))
            s.tables["fills"] += (len(s.regions) - 1, len(s.fill_values))
            s.fill_values.append(op.value)
        elif isinstance(op, ValueOp):
            s = _of(slices, host_of(op.dst_device), f"value op {i}")
            s.values.append([i, op.dst_device, op.dst_partition, op.name, op.src_partition, op.src_device, op.value])
            if op.src_partition is not None and host_of(op.src_device) != s.host:
                _of(slices, host_of(op.src_device), f"value op {i}").gives.append([i, op.src_partition, op.src_device, op.name, s.host])
    tag = 0
    for m in sorted(plan.messages, key=lambda m: m.id):
        a, b = slices.get(m.src_host), slices.get(m.dst_host)
        if a is None or b is None:
            _of(slices, m.src_host if a is None else m.dst_host, f"message {m.id}")
        regions = _regions(m, plan, a, b, src, dst)
        if m.src_host == m.dst_host:
            a.tables["copies"] += [x for i, _, sr, dr in regions for x in (m.round, m.id, i, sr, dr)]
            continue
        for part in _parts(regions, a, b, dst.itemsizes):
            if tag >= MAX_PARTS:
                raise IRError(f"the plan has more than {MAX_PARTS} network parts; split it")
            nbytes = sum(op.box.volume * dst.itemsizes[op.tensor] for _, op, _, _ in part)
            for s, outgoing, other in ((a, 1, m.dst_host), (b, 0, m.src_host)):
                first = len(s.tables["part_regions"]) // 2
                for i, _, sr, dr in part:
                    s.tables["part_regions"] += (sr if outgoing else dr, i)
                s.tables["parts"] += (m.round, s.peer(other), outgoing, tag, nbytes, first, len(part), m.id)
            tag += 1
    rounds = max((m.round for m in plan.messages), default=0) + 1
    return {h: s.encode(rounds) for h, s in slices.items()}


def _of(slices: dict[str, _Slice], host: str, what: str) -> _Slice:
    if host not in slices:
        raise IRError(f"{what} runs on host {host!r}, which has no slice (hosts: {sorted(slices)})")
    return slices[host]


def _src_region(s: _Slice, op: CopyOp, src: PTC, dst: PTC) -> int:
    side, ptc = ("src", src) if op.src_side == "src" else ("dst", dst)
    return s.region(side, ptc, ptc.subtensor_map[op.src_subtensor], op.src_device, op.src_piece, op.box)


def _dst_region(s: _Slice, op: CopyOp, dst: PTC) -> int:
    return s.region("dst", dst, dst.subtensor_map[op.dst_subtensor], op.dst_device, op.dst_piece, op.box)


def _parts(ops: list[tuple[int, CopyOp, int, int]], a: _Slice, b: _Slice, itemsizes: dict[str, int]) -> list[list]:
    """A message's parts, from (op id, op, src region on `a`, dst region on `b`): big ops
    contiguous on a side alone, in op order, then the packed rest."""
    singles, packed = [], []
    for item in ops:
        _, op, sr, dr = item
        (_, _, shape, src_strides), (_, _, _, dst_strides) = a.regions[sr], b.regions[dr]
        big = op.box.volume * itemsizes[op.tensor] >= SINGLE_MIN
        if big and (c_contiguous(shape, src_strides) or c_contiguous(shape, dst_strides)):
            singles.append([item])
        else:
            packed.append(item)
    return singles + ([packed] if packed else [])


def _regions(m: Message, plan: Plan, a: _Slice, b: _Slice, src: PTC, dst: PTC) -> list[tuple[int, CopyOp, int, int]]:
    """(op id, op, src region on `a`, dst region on `b`) of each op of `m`. Raises: IRError naming
    the message and the op whose regions do not exist (or that is no copy)."""
    out = []
    try:
        for i in m.ops:
            op = plan.ops[i]
            if not isinstance(op, CopyOp):
                raise IRError(f"a message lists a {type(op).__name__}; only copies travel")
            out.append((i, op, _src_region(a, op, src, dst), _dst_region(b, op, dst)))
    except (IRError, KeyError, IndexError) as e:
        what = (f"copy of {op.tensor!r} box {op.box}, device {op.src_device} -> {op.dst_device}"
                if isinstance(op, CopyOp) else type(op).__name__)  # fmt: skip
        raise IRError(f"message {m.id} ({m.src_host} -> {m.dst_host}, round {m.round}), op {i} ({what}): "
                      f"{type(e).__name__ + ': ' if not isinstance(e, IRError) else ''}{e}") from e  # fmt: skip
    return out
