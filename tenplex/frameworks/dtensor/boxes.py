"""DTensor placements on a device mesh, turned into boxes (torch-free).

A DTensor of global shape `G` lives on a device mesh of shape `M` (one entry per mesh dim) with
one placement per mesh dim: `Shard(d)` splits tensor dim `d` over that mesh dim with
`torch.chunk` semantics, `Replicate()` gives every rank of that mesh dim the same data.
Placements apply left to right, each splitting the *current local* extent, so `(Shard(0),
Shard(0))` on a 2×2 mesh cuts dim 0 in two and each half in two again.

`local_box(G, M, placements, coordinate)` is the one function that turns this into the global
box a mesh coordinate holds. It equals torch's `compute_local_shape_and_global_offset`
(torch/distributed/tensor/_utils.py), including its uneven rule (docs/conventions.md §6.2): for `n`
elements over `k` ranks, `c = ceil(n/k)`, rank `i` starts at `i·c` and holds
`max(0, min(n, i·c + c) − i·c)` elements, so trailing shards are smaller or EMPTY; an empty
shard's start in that dim is the global extent `G[d]`, as torch reports it.

Invariants:
- a mesh shape has 1 to `MAX_MESH_DIMS` dims, each >= 1, and at most `MAX_DEVICES` devices in all
  (a layout file naming 10^9 devices is refused at once, not planned for minutes); a coordinate
  lies inside the mesh;
- there is one placement per mesh dim; a Shard dim lies in [-ndim, ndim) and is normalised to
  [0, ndim); a 0-d tensor has only Replicate placements;
- `_StridedShard` and `Partial` placements are not boxes and are rejected by their name.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator, Sequence

import attrs

from tenplex.ir.box import Box
from tenplex.ir.errors import SpecError

MAX_DEVICES = 1 << 20  # far beyond any job tenplex plans for, small enough to plan for in memory
MAX_MESH_DIMS = 16


class PlacementError(SpecError):
    """A mesh, placement or coordinate that does not describe a DTensor layout."""


def _int(value: object) -> int:
    if isinstance(value, bool):
        raise PlacementError(f"shard dim {value!r} is not an integer")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise PlacementError(f"shard dim {value!r} is not an integer") from None


@attrs.frozen
class Shard:
    """Tensor dim `dim` split over one mesh dim with torch.chunk semantics."""

    dim: int = attrs.field(converter=_int)

    def __str__(self) -> str:
        return f"S({self.dim})"


@attrs.frozen
class Replicate:
    """The whole (current local) extent on every rank of one mesh dim."""

    def __str__(self) -> str:
        return "R"


Placement = Shard | Replicate
_SHARD = re.compile(r"^(?:S|Shard)\(?(-?\d+)\)?$")
_REPLICATE = ("R", "Replicate", "Replicate()")


def parse_placement(text: str) -> Placement:
    """`"S(0)"`, `"Shard(1)"`, `"S-1"`, `"R"`, `"Replicate()"` → a placement.

    Raises:
        PlacementError: any other text, naming it (e.g. `_StridedShard`, `Partial`)."""
    if not isinstance(text, str):
        raise PlacementError(f"placement {text!r} is not a string like 'S(0)' or 'R'")
    s = text.strip().replace(" ", "").replace("dim=", "")
    if s in _REPLICATE:
        return Replicate()
    m = _SHARD.match(s)
    if m:
        return Shard(int(m.group(1)))
    raise PlacementError(f"placement {text!r} is not Shard(d) ('S(d)') or Replicate ('R')")


def check_mesh(mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """The mesh shape as a tuple. Raises PlacementError unless it is >= 1 dims of sizes >= 1."""
    shape = tuple(mesh_shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise PlacementError(f"mesh shape {_brief(shape)} must be one or more positive integers")
    if len(shape) > MAX_MESH_DIMS:
        raise PlacementError(f"mesh shape {_brief(shape)} has {len(shape)} dims, more than {MAX_MESH_DIMS}")
    if math.prod(shape) > MAX_DEVICES:
        raise PlacementError(f"mesh shape {_brief(shape)} has {math.prod(shape)} devices, more than {MAX_DEVICES}")
    return shape


def _brief(shape: tuple) -> str:
    return str(list(shape)) if len(shape) <= 20 else f"[{', '.join(map(str, shape[:20]))}, ...]"


def normalize(placements: Sequence[Placement], ndim: int, mesh_shape: Sequence[int]) -> tuple[Placement, ...]:
    """Placements checked against a tensor of `ndim` dims and the mesh; Shard dims made >= 0.

    Raises:
        PlacementError: wrong count, unknown kind, or a Shard dim outside the tensor."""
    mesh = check_mesh(mesh_shape)
    out: list[Placement] = []
    if len(placements) != len(mesh):
        raise PlacementError(f"placements {[str(p) for p in placements]} do not match mesh shape {list(mesh)} (one per mesh dim)")
    for p in placements:
        if isinstance(p, Replicate):
            out.append(p)
        elif isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise PlacementError(f"placement {p} shards dim {p.dim} of a {ndim}-d tensor")
            out.append(Shard(p.dim % ndim))
        else:
            raise PlacementError(f"placement {p!r} is not Shard or Replicate")
    return tuple(out)


def chunk(size: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of chunk `index` of `size` elements cut in `parts` by torch.chunk's
    rule; offset is relative to the chunked extent (meaningless when length is 0)."""
    if size % parts == 0:
        step = size // parts
        return step * index, step
    step = -(-size // parts)
    start = step * index
    return min(size, start), max(0, min(size, start + step) - start)


def local_box(global_shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Placement],
              coordinate: Sequence[int]) -> Box:  # fmt: skip
    """The global box that mesh `coordinate` holds (see the module docstring).

    Raises:
        PlacementError: invalid mesh, placements or coordinate (names the values)."""
    shape = tuple(global_shape)
    mesh = check_mesh(mesh_shape)
    placements = normalize(placements, len(shape), mesh)
    coord = tuple(coordinate)
    if len(coord) != len(mesh) or any(not 0 <= c < m for c, m in zip(coord, mesh)):
        raise PlacementError(f"coordinate {list(coord)} is outside mesh shape {list(mesh)}")
    start, size = [0] * len(shape), list(shape)
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            offset, length = chunk(size[p.dim], mesh[mesh_dim], coord[mesh_dim])
            start[p.dim] = start[p.dim] + offset if length else shape[p.dim]
            size[p.dim] = length
    return Box(tuple(start), tuple(a + n for a, n in zip(start, size)))


def coordinates(mesh_shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every coordinate of the mesh in row-major order (position i = mesh rank i)."""
    mesh = check_mesh(mesh_shape)
    for i in range(math.prod(mesh)):
        yield coordinate_of(i, mesh)


def coordinate_of(index: int, mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """The row-major coordinate of position `index` in the mesh."""
    out = []
    for side in reversed(tuple(mesh_shape)):
        index, c = divmod(index, side)
        out.append(c)
    return tuple(reversed(out))


def format_placements(placements: Sequence[Placement]) -> list[str]:
    return [str(p) for p in placements]
