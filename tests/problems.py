"""Hypothesis strategies for whole reconfiguration problems: a (src PTC, dst PTC) pair.

Both PTCs hold the same logical tensors; each side lays every tensor out with one of the layouts
that real jobs use, then groups the sub-tensors into partitions and allocates the partitions
onto its own subset of one shared topology (device ids are physical: a device in both PTCs is on
the same host). Layouts:

- `whole`: one piece, the whole tensor (DP replica of a small tensor, a norm);
- `even`: a TP-like even split along a random dim;
- `uneven`: random cut points along a dim (uneven PP/TP; some shards may be empty);
- `glu`: the fused SwiGLU layout `[gate_r; up_r]`, two pieces per shard;
- `padded`: a split whose local arrays are larger than the piece (vocabulary padding), filled
  with a random value;
- `flat`: ZeRO / distributed-optimizer fragments, 1-D local runs over random flat ranges of the
  tensor (`row_major_boxes`: fragments may start and end mid-row), with padding around them;
- `extra` (added on top of a complete layout): a region held a second time by another
  partition (tied embeddings, overlapping src holders), or `tied`: held twice by one
  sub-tensor.

src is always complete (every element held at least once), so every good problem compiles;
dst may be partial. `bad_problems()` removes src sub-tensors of one tensor until src lacks a
region that dst needs.
"""

from __future__ import annotations

import math

import attrs
from hypothesis import assume
from hypothesis import strategies as st

from tenplex.compiler import CompileOptions
from tenplex.ir import (
    PTC,
    Allocation,
    Box,
    Device,
    Partition,
    Piece,
    SubTensor,
    TensorMeta,
    Topology,
    Value,
    row_major_boxes,
)

DTYPES = ("float32", "bfloat16", "float16", "int64", "int8", "bool", "float64")
VALUE_NAMES = ("iteration", "rng_state", "args")
FILLS = (0, 1, -1, 3, 0.5, -2.25)


@attrs.frozen
class Shard:
    """One future sub-tensor: its local shape, pieces and fill (the id is given later)."""

    kind: str
    tensor: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    fill: float = 0


def _slab(shape: tuple[int, ...], dim: int, a: int, b: int) -> Box:
    """The box of `shape` restricted to [a, b) along `dim`."""
    return Box(tuple(a if d == dim else 0 for d in range(len(shape))), tuple(b if d == dim else s for d, s in enumerate(shape)))


@st.composite
def _cuts(draw, total: int, even: bool = False, max_parts: int = 4) -> list[tuple[int, int]]:
    """[a, b) ranges tiling [0, total) in order: `even` ones of a divisor's size, or random
    (possibly empty) ones."""
    if even and total > 0:
        k = draw(st.sampled_from([k for k in range(1, max_parts + 1) if total % k == 0]))
        step = total // k
        return [(i * step, (i + 1) * step) for i in range(k)]
    inner = draw(st.lists(st.integers(0, total), max_size=max_parts - 1))
    points = [0, *sorted(inner), total]
    return list(zip(points, points[1:]))


@st.composite
def _split(draw, meta: TensorMeta, even: bool) -> list[Shard]:
    dim = draw(st.integers(0, len(meta.shape) - 1))
    kind = "even" if even else "uneven"
    out = []
    for a, b in draw(_cuts(meta.shape[dim], even)):
        box = _slab(meta.shape, dim, a, b)
        out.append(Shard(kind, meta.name, box.shape, (Piece(box, Box.from_shape(box.shape)),)))
    return out


@st.composite
def _glu(draw, meta: TensorMeta) -> list[Shard]:
    """Rows [0, h) are `gate`, [h, 2h) are `up`; shard r holds [gate_r; up_r] stacked."""
    half = meta.shape[0] // 2
    out = []
    for a, b in draw(_cuts(half, draw(st.booleans()))):
        n = b - a
        local = (2 * n,) + meta.shape[1:]
        gate = Piece(_slab(meta.shape, 0, a, b), _slab(local, 0, 0, n))
        up = Piece(_slab(meta.shape, 0, half + a, half + b), _slab(local, 0, n, 2 * n))
        out.append(Shard("glu", meta.name, local, (gate, up)))
    return out


@st.composite
def _padded(draw, meta: TensorMeta) -> list[Shard]:
    """A split whose local arrays have extra fill along a random dim (vocabulary padding)."""
    base = draw(_split(meta, draw(st.booleans())))
    pad_dim = draw(st.integers(0, len(meta.shape) - 1))
    fill = draw(st.sampled_from(FILLS))
    out = []
    for s in base:
        (piece,) = s.pieces
        extra = draw(st.integers(0, 2))
        offset = draw(st.integers(0, extra))
        local = tuple(n + extra if d == pad_dim else n for d, n in enumerate(piece.global_box.shape))
        at = Box.from_shape(piece.global_box.shape).translate(tuple(offset if d == pad_dim else 0 for d in range(len(local))))
        out.append(Shard("padded", meta.name, local, (Piece(piece.global_box, at),), fill))
    return out


@st.composite
def _flat_fragment(draw, meta: TensorMeta, start: int, stop: int, kind: str = "flat") -> Shard:
    """Flat range [start, stop) of the tensor as consecutive 1-D runs, with padding around."""
    lead, tail = draw(st.integers(0, 1)), draw(st.integers(0, 2))
    pieces, at = [], lead
    for g in row_major_boxes(meta.shape, start, stop):
        pieces.append(Piece(g, Box((at,), (at + g.volume,))))
        at += g.volume
    return Shard(kind, meta.name, (at + tail,), tuple(pieces), draw(st.sampled_from(FILLS)) if lead or tail else 0)


@st.composite
def _flat(draw, meta: TensorMeta) -> list[Shard]:
    return [draw(_flat_fragment(meta, a, b)) for a, b in draw(_cuts(math.prod(meta.shape)))]


@st.composite
def _extra(draw, meta: TensorMeta) -> Shard:
    """A second holder of some region: a random flat range, a random box, or a random box held
    twice by one sub-tensor (`tied`: two pieces with one global box, stacked locally)."""
    n = math.prod(meta.shape)
    kind = draw(st.sampled_from(["flat", "box", "tied"] if meta.shape else ["flat"]))
    if kind == "flat":
        a = draw(st.integers(0, n))
        return draw(_flat_fragment(meta, a, draw(st.integers(a, n)), kind="extra"))
    start, stop = [], []
    for side in meta.shape:
        a = draw(st.integers(0, max(side - 1, 0)))
        start.append(a)
        stop.append(draw(st.integers(min(a + 1, side), side)))
    box = Box(tuple(start), tuple(stop))
    local = Box.from_shape(box.shape)
    if kind == "box":
        return Shard("extra", meta.name, box.shape, (Piece(box, local),))
    twice = (2 * box.shape[0],) + box.shape[1:]
    return Shard("tied", meta.name, twice, (Piece(box, local), Piece(box, local.translate((box.shape[0],) + (0,) * (box.ndim - 1)))))


@st.composite
def layouts(draw, meta: TensorMeta) -> list[Shard]:
    """Shards that together hold every element of `meta` (at least once)."""
    kinds = {"whole": st.just([Shard("whole", meta.name, meta.shape, (Piece(meta.box, meta.box),))]), "flat": _flat(meta)}
    if meta.shape:
        kinds |= {"even": _split(meta, True), "uneven": _split(meta, False), "padded": _padded(meta)}
    if meta.shape and meta.shape[0] >= 2 and meta.shape[0] % 2 == 0:
        kinds["glu"] = _glu(meta)
    return draw(kinds[draw(st.sampled_from(list(kinds)))])


@st.composite
def topologies(draw) -> Topology:
    """1-4 hosts of 1-4 devices each; device ids shuffled over the hosts."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    ids = draw(st.permutations(range(sum(sizes))))
    hosts = [f"h{h}" for h, n in enumerate(sizes) for _ in range(n)]
    return Topology(tuple(Device(i, h) for i, h in zip(ids, hosts)))


@st.composite
def tensors(draw, max_tensors: int = 3, max_side: int = 5) -> list[TensorMeta]:
    n = draw(st.integers(1, max_tensors))
    out = []
    for i in range(n):
        ndim = draw(st.integers(0, 3))
        shape = tuple(draw(st.integers(1, max_side)) for _ in range(ndim))
        if shape and draw(st.integers(0, 9)) == 0:
            shape = (0,) + shape[1:]  # an empty tensor now and then
        out.append(TensorMeta(f"t{i}", shape, draw(st.sampled_from(DTYPES))))
    return out


json_values = st.one_of(st.integers(-5, 1000), st.text("abc", max_size=3), st.lists(st.integers(0, 9), max_size=3))


@st.composite
def _side_devices(draw, topology: Topology, other: list[int] | None = None) -> list[int]:
    """All devices, a random subset, or (given the other side's devices) the rest of them
    (a redeployment onto other devices)."""
    ids = [d.id for d in topology.devices]
    rest = [i for i in ids if other is not None and i not in other]
    mode = draw(st.sampled_from(["all", "subset", "others"] if rest else ["all", "subset"]))
    if mode == "all":
        return ids
    if mode == "others":
        return rest
    return sorted(draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True)))


@st.composite
def _ptc(draw, side: str, metas: list[TensorMeta], shards: list[Shard], topology: Topology, devices: list[int], values) -> PTC:
    """Group `shards` into random partitions (several tensors, several shards each) allocated
    to 1-3 of `devices` each, with values drawn from `values`."""
    subtensors = [SubTensor(f"{s.tensor}/{side}{i}.{s.kind}", s.tensor, f"model/{s.tensor}", s.shape, s.pieces, s.fill) for i, s in enumerate(shards)]
    nparts = draw(st.integers(1, max(1, min(len(subtensors), 5))))
    members: list[list[str]] = [[] for _ in range(nparts)]
    for s in subtensors:
        members[draw(st.integers(0, nparts - 1))].append(s.id)
    partitions = [Partition(f"{side}{i}", ids, draw(values)) for i, ids in enumerate(members)]
    replicas = st.lists(st.sampled_from(devices), min_size=1, max_size=min(3, len(devices)), unique=True)
    allocation = Allocation({p.id: tuple(draw(replicas)) for p in partitions})
    if not draw(st.booleans()):
        topology = Topology(tuple(d for d in topology.devices if d.id in devices))
    return PTC(tuple(metas), tuple(subtensors), tuple(partitions), allocation, topology)


@st.composite
def _src_values(draw, literal: dict) -> dict[str, Value]:
    """Replicated literals: every src partition holding a name agrees on its value."""
    return {n: Value(literal[n]) for n in draw(st.lists(st.sampled_from(VALUE_NAMES), unique=True, max_size=2))}


@st.composite
def _dst_values(draw, inheritable: list[str]) -> dict[str, Value]:
    """Inherited (Value(None), only names src has), per-rank literals, replicated literals."""
    out = {}
    for n in draw(st.lists(st.sampled_from(VALUE_NAMES), unique=True, max_size=2)):
        how = draw(st.sampled_from(["inherit", "per-rank", "literal"]))
        if how == "inherit" and n in inheritable:
            out[n] = Value(None)
        elif how == "per-rank":
            out[n] = Value(draw(st.none() | json_values), "per-rank")
        else:
            out[n] = Value(draw(json_values))
    return out


@st.composite
def _layout_pair(draw, meta: TensorMeta, dst_complete: bool | None) -> tuple[list[Shard], list[Shard]]:
    """src: a complete layout plus maybe a second holder; dst: the same layout now and then
    (a DP-only change), else another one, maybe with an extra holder and maybe partial."""
    src = draw(layouts(meta)) + draw(st.lists(_extra(meta), max_size=1))
    dst = (src if draw(st.integers(0, 3)) == 0 else draw(layouts(meta))) + draw(st.lists(_extra(meta), max_size=1))
    if not (draw(st.integers(0, 3)) > 0 if dst_complete is None else dst_complete):
        dst = [s for s in dst if draw(st.booleans())]
    return src, dst


@st.composite
def problems(draw, max_tensors: int = 3, dst_complete: bool | None = None, max_side: int = 5) -> tuple[PTC, PTC]:
    """A (src, dst) pair that compiles: src complete, dst any layout (partial unless
    `dst_complete`), both over one topology."""
    topology = draw(topologies())
    metas = draw(tensors(max_tensors, max_side))
    pairs = [draw(_layout_pair(meta, dst_complete)) for meta in metas]
    literal = {name: draw(json_values) for name in VALUE_NAMES}
    src_devices = draw(_side_devices(topology))
    src = draw(_ptc("s", metas, [s for p, _ in pairs for s in p], topology, src_devices, _src_values(literal)))
    inheritable = sorted({n for p in src.partitions for n, _ in p.values})
    dst_devices = draw(_side_devices(topology, src_devices))
    dst = draw(_ptc("d", metas, [s for _, p in pairs for s in p], topology, dst_devices, _dst_values(inheritable)))
    return src, dst


@st.composite
def bad_problems(draw, max_tensors: int = 3) -> tuple[PTC, PTC, str]:
    """(src, dst, tensor): src lacks a region of `tensor` that dst needs (dst is complete), or
    lacks the tensor altogether."""
    src, dst = draw(problems(max_tensors, dst_complete=True))
    candidates = [t.name for t in src.tensors if math.prod(t.shape) > 0]
    assume(candidates)
    name = draw(st.sampled_from(candidates))
    if draw(st.integers(0, 4)) == 0:
        return _without(src, lambda s: s.tensor == name, drop_tensor=name), dst, name
    own = [s.id for s in src.by_tensor[name]]
    drop = set(draw(st.lists(st.sampled_from(own), min_size=1, unique=True)))
    bad = _without(src, lambda s: s.id in drop)
    if name not in bad.uncovered():
        bad = _without(src, lambda s: s.tensor == name)
    return bad, dst, name


def _without(ptc: PTC, dropped, drop_tensor: str | None = None) -> PTC:
    """`ptc` without the sub-tensors `dropped` selects (and without tensor `drop_tensor`)."""
    gone = {s.id for s in ptc.subtensors if dropped(s)}
    return attrs.evolve(
        ptc,
        tensors=tuple(t for t in ptc.tensors if t.name != drop_tensor),
        subtensors=tuple(s for s in ptc.subtensors if s.id not in gone),
        partitions=tuple(attrs.evolve(p, subtensors=tuple(i for i in p.subtensors if i not in gone)) for p in ptc.partitions),
    )


@st.composite
def compile_options(draw, baseline: str | None = None) -> CompileOptions:
    """Small messages (16..4096 bytes, so copies are chunked) and a budget of 1-4 messages."""
    size = draw(st.integers(16, 4096))
    budget = draw(st.integers(size, 4 * size))
    return CompileOptions(place_ranks=draw(st.booleans()), max_message_bytes=size, memory_budget_bytes=budget, baseline=baseline)


@st.composite
def shuffled(draw, ptc: PTC, replicas: bool = False) -> PTC:
    """The same PTC built from shuffled input tuples (tensors, sub-tensors, partitions, each
    partition's sub-tensor list, allocation entries, devices) and, with `replicas`, each
    partition's replica list (which a plan's allocation echoes, so only for src)."""
    perm = lambda xs: draw(st.permutations(list(xs)))  # noqa: E731
    partitions = [attrs.evolve(p, subtensors=tuple(perm(p.subtensors))) for p in ptc.partitions]
    allocation = [(pid, tuple(perm(devs)) if replicas else devs) for pid, devs in ptc.allocation.items]
    return PTC(
        tuple(perm(ptc.tensors)),
        tuple(perm(ptc.subtensors)),
        tuple(perm(partitions)),
        Allocation(perm(allocation)),
        Topology(tuple(perm(ptc.topology.devices)), ptc.topology.links),
    )
