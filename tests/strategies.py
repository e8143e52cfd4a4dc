"""Shared hypothesis strategies: boxes, shapes, dtypes, TP-like splits, pieces and whole PTCs.

Everything a strategy returns is valid by construction (the IR refuses invalid values), and
`ptcs()` returns *complete* PTCs unless asked for gaps.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from tenplex.ir import (
    ITEMSIZE,
    PTC,
    Allocation,
    Box,
    Device,
    Links,
    Partition,
    Piece,
    SubTensor,
    TensorMeta,
    Topology,
    Value,
    row_major_boxes,
)

dtypes = st.sampled_from(sorted(ITEMSIZE))


def shapes(min_ndim: int = 0, max_ndim: int = 3, min_side: int = 0, max_side: int = 6) -> st.SearchStrategy:
    return st.lists(st.integers(min_side, max_side), min_size=min_ndim, max_size=max_ndim).map(tuple)


@st.composite
def boxes_in(draw, shape: tuple[int, ...], allow_empty: bool = True) -> Box:
    """A box inside an array of `shape` (non-empty unless `allow_empty` and a side allows it)."""
    lo = 0 if allow_empty else 1
    start, stop = [], []
    for side in shape:
        a = draw(st.integers(0, max(side - lo, 0)))
        b = draw(st.integers(min(a + lo, side), side))
        start.append(a)
        stop.append(b)
    return Box(tuple(start), tuple(stop))


@st.composite
def boxes(draw, ndim: int | None = None, max_coord: int = 10, allow_empty: bool = True) -> Box:
    """A box of `ndim` (random when None) dims with coordinates in [0, max_coord]."""
    n = draw(st.integers(0, 3)) if ndim is None else ndim
    return draw(boxes_in((max_coord,) * n, allow_empty))


@st.composite
def box_lists(draw, ndim: int | None = None, max_size: int = 8, **kw) -> list[Box]:
    """Several boxes of one ndim."""
    n = draw(st.integers(0, 3)) if ndim is None else ndim
    return draw(st.lists(boxes(n, **kw), max_size=max_size))


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def even_split(shape: tuple[int, ...], dim: int, parts: int) -> list[Box]:
    """`parts` equal boxes of `shape` cut along `dim` (as TP splits a weight)."""
    step = shape[dim] // parts
    return [
        Box(tuple(i * step if d == dim else 0 for d in range(len(shape))),
            tuple((i + 1) * step if d == dim else s for d, s in enumerate(shape)))
        for i in range(parts)
    ]  # fmt: skip


@st.composite
def tp_splits(draw, shape: tuple[int, ...]) -> list[Box]:
    """An even split of a non-scalar `shape` along a random dim into a divisor of its side."""
    dim = draw(st.integers(0, len(shape) - 1))
    return even_split(shape, dim, draw(st.sampled_from(divisors(shape[dim]))))


def flat_pieces(shape: tuple[int, ...], start: int, stop: int, local_start: int = 0) -> list[Piece]:
    """Pieces mapping flat row-major range [start, stop) of `shape` to consecutive 1-D local runs."""
    out, at = [], local_start
    for g in row_major_boxes(shape, start, stop):
        out.append(Piece(g, Box((at,), (at + g.volume,))))
        at += g.volume
    return out


@st.composite
def cuts(draw, total: int, max_parts: int = 4) -> list[tuple[int, int]]:
    """[start, stop) ranges that tile [0, total) in order (some may be empty)."""
    inner = draw(st.lists(st.integers(0, total), max_size=max_parts - 1))
    points = [0, *sorted(inner), total]
    return list(zip(points, points[1:]))


fills = st.one_of(st.just(0), st.integers(-3, 3), st.floats(-4, 4, allow_nan=False, width=32))


@st.composite
def tensor_layouts(draw, meta: TensorMeta) -> list[SubTensor]:
    """Sub-tensors that together cover `meta`: even (padded) splits, fused pairs, or flat runs."""
    shape, name = meta.shape, meta.name
    kinds = ["flat"] if not shape else ["split", "fused", "flat"]
    kind = draw(st.sampled_from(kinds))
    path = f"model/{name}"
    if kind == "flat":
        out = []
        for i, (a, b) in enumerate(draw(cuts(math.prod(shape)))):
            pad = draw(st.integers(0, 2))
            out.append(SubTensor(f"{name}/flat{i}", name, path, (b - a + pad,), flat_pieces(shape, a, b), draw(fills)))
        return out
    parts = draw(tp_splits(shape))
    if kind == "fused" and len(parts) % 2 == 0:
        half = len(parts) // 2
        dim = next(d for d in range(len(shape)) if parts[0].shape[d] != shape[d])
        out = []
        for r in range(half):
            lo, hi = parts[r], parts[r + half]
            step = lo.shape[dim]
            local_hi = Box.from_shape(hi.shape).translate(tuple(step if d == dim else 0 for d in range(len(shape))))
            local_shape = tuple(2 * step if d == dim else s for d, s in enumerate(lo.shape))
            pieces = [Piece(lo, Box.from_shape(lo.shape)), Piece(hi, local_hi)]
            out.append(SubTensor(f"{name}/fused{r}", name, path, local_shape, pieces))
        return out
    out = []
    for i, part in enumerate(parts):
        pad = draw(st.lists(st.integers(0, 1), min_size=len(shape), max_size=len(shape)))
        local_shape = tuple(s + p for s, p in zip(part.shape, pad))
        piece = Piece(part, Box.from_shape(part.shape))
        out.append(SubTensor(f"{name}/tp{i}", name, path, local_shape, [piece], draw(fills) if any(pad) else 0))
    return out


@st.composite
def topologies(draw, max_hosts: int = 3, max_per_host: int = 3) -> Topology:
    hosts = draw(st.integers(1, max_hosts))
    per = draw(st.integers(1, max_per_host))
    base = draw(st.integers(0, 4))
    devices = [Device(base + h * per + i, f"h{h}") for h in range(hosts) for i in range(per)]
    bandwidth = st.floats(1.0, 1e13, allow_nan=False)
    links = draw(st.one_of(st.just(Links()), st.builds(Links, bandwidth, bandwidth, bandwidth)))
    return Topology(tuple(devices), links)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text("abz _é\"\\", max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=3), inner, max_size=3),
    max_leaves=5,
)  # fmt: skip
values = st.builds(Value, json_values, st.sampled_from(["replicated", "per-rank"]))
tensor_names = st.sampled_from(["w", "b", "embed", "layers.0.mlp.fc1.weight", "optim.exp_avg/w", "ünï"])


@st.composite
def ptcs(draw, complete: bool = True, max_tensors: int = 3) -> PTC:
    """A random valid PTC; with `complete=False` some sub-tensors may be dropped."""
    topology = draw(topologies())
    names = draw(st.lists(tensor_names, min_size=1, max_size=max_tensors, unique=True))
    tensors = [TensorMeta(n, draw(shapes(max_ndim=3, min_side=1, max_side=6)), draw(dtypes)) for n in names]
    subtensors = [st_ for meta in tensors for st_ in draw(tensor_layouts(meta))]
    if not complete:
        subtensors = [s for s in subtensors if draw(st.booleans())]
    nparts = draw(st.integers(1, 4))
    members: list[list[str]] = [[] for _ in range(nparts)]
    for s in subtensors:
        members[draw(st.integers(0, nparts - 1))].append(s.id)
    partitions = [
        Partition(f"p{i}", ids, draw(st.dictionaries(st.sampled_from(["iteration", "rng", "args"]), values, max_size=2)))
        for i, ids in enumerate(members)
    ]
    ids = [d.id for d in topology.devices]
    replicas = st.lists(st.sampled_from(ids), min_size=1, max_size=min(3, len(ids)), unique=True)
    allocation = Allocation({p.id: draw(replicas) for p in partitions})
    return PTC(tuple(tensors), tuple(subtensors), tuple(partitions), allocation, topology)
