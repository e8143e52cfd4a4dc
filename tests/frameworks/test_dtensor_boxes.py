"""DTensor placements → boxes: named cases, torch's own `compute_local_shape_and_global_offset`
as the oracle over random shapes/meshes/placements, tiling, and one test per error message."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.frameworks.dtensor.boxes import (
    PlacementError,
    Replicate,
    Shard,
    chunk,
    coordinates,
    local_box,
    normalize,
    parse_placement,
)
from tenplex.ir.box import Box, disjoint_union

torch_utils = pytest.importorskip("torch.distributed.tensor._utils")
torch_tensor = pytest.importorskip("torch.distributed.tensor")

S, R = Shard, Replicate

# name: (global shape, mesh, placements, coordinate, (start, stop))
CASES = {
    "even_rows_tp2": ((8, 4), (2,), [S(0)], (1,), ((4, 0), (8, 4))),
    "uneven_5_over_4_last": ((5,), (4,), [S(0)], (2,), ((4,), (5,))),
    "uneven_5_over_4_empty": ((5,), (4,), [S(0)], (3,), ((5,), (5,))),
    "six_over_4_empty_not_1": ((6,), (4,), [S(0)], (3,), ((6,), (6,))),
    "nine_over_6_fifth": ((9,), (6,), [S(0)], (4,), ((8,), (9,))),
    "columns_tp3": ((2, 7), (3,), [S(1)], (2,), ((0, 6), (2, 7))),
    "replicate": ((3, 3), (4,), [R()], (3,), ((0, 0), (3, 3))),
    # torch docstring: [2,5] with (Shard(1), Shard(1)) on 2x2 -> widths 2,1,1,1 at 0,2,3,4
    "docstring_s1s1_r1": ((2, 5), (2, 2), [S(1), S(1)], (0, 1), ((0, 2), (2, 3))),
    "docstring_s1s1_r3": ((2, 5), (2, 2), [S(1), S(1)], (1, 1), ((0, 4), (2, 5))),
    "grid_s0s1": ((7, 5), (2, 2), [S(0), S(1)], (1, 0), ((4, 0), (7, 3))),
    "dp_replicate_tp_shard": ((7,), (2, 2), [R(), S(0)], (1, 1), ((4,), (7,))),
    "negative_dim": ((3, 8), (4,), [S(-1)], (1,), ((0, 2), (3, 4))),
    "scalar": ((), (2, 2), [R(), R()], (1, 0), ((), ())),
    "empty_then_split": ((2, 3), (4, 2), [S(0), S(0)], (3, 1), ((2, 0), (2, 3))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_named_cases(name):
    shape, mesh, placements, coord, (start, stop) = CASES[name]
    assert local_box(shape, mesh, placements, coord) == Box(start, stop)


def test_chunk_is_torch_chunk_with_trailing_empties():
    assert [chunk(5, 4, i)[1] for i in range(4)] == [2, 2, 1, 0]
    assert [chunk(6, 4, i)[1] for i in range(4)] == [2, 2, 2, 0]
    assert [chunk(9, 6, i)[1] for i in range(6)] == [2, 2, 2, 2, 1, 0]


def _to_torch(p):
    return torch_tensor.Shard(p.dim) if isinstance(p, Shard) else torch_tensor.Replicate()


@st.composite
def layouts(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    mesh = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    kinds = [st.just(R())] + ([st.integers(-ndim, ndim - 1).map(S)] if ndim else [])
    placements = draw(st.lists(st.one_of(kinds), min_size=len(mesh), max_size=len(mesh)))
    return shape, mesh, placements


@given(layouts(), st.data())
def test_local_box_equals_torch(layout, data):
    shape, mesh, placements = layout
    coord = tuple(data.draw(st.integers(0, m - 1)) for m in mesh)
    want_shape, want_offset = torch_utils._compute_local_shape_and_global_offset(
        shape, mesh, list(coord), [_to_torch(p) for p in normalize(placements, len(shape), mesh)]
    )
    box = local_box(shape, mesh, placements, coord)
    assert (box.shape, box.start) == (tuple(want_shape), tuple(want_offset))


@given(layouts())
def test_boxes_tile_the_tensor(layout):
    shape, mesh, placements = layout
    boxes = [local_box(shape, mesh, placements, c) for c in coordinates(mesh)]
    replicas = math.prod(m for m, p in zip(mesh, placements) if isinstance(p, Replicate))
    assert sum(b.volume for b in boxes) == math.prod(shape) * replicas
    assert sum(b.volume for b in disjoint_union(boxes)) == math.prod(shape)


@pytest.mark.parametrize("text, want", [("S(0)", S(0)), ("Shard(dim=2)", S(2)), ("S-1", S(-1)), ("R", R()), ("Replicate()", R())])
def test_parse_placement(text, want):
    assert parse_placement(text) == want


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: parse_placement("_StridedShard(0, sf=2)"), "is not Shard(d) ('S(d)') or Replicate ('R')"),
        (lambda: parse_placement("Partial()"), "'Partial()' is not Shard(d)"),
        (lambda: local_box((4,), (), [], ()), "mesh shape [] must be one or more positive integers"),
        (lambda: local_box((4,), (2, 0), [R(), R()], (0, 0)), "mesh shape [2, 0] must be one or more"),
        (lambda: local_box((4,), (2,), [R(), R()], (0,)), "placements ['R', 'R'] do not match mesh shape [2]"),
        (lambda: local_box((4,), (2,), [S(1)], (0,)), "placement S(1) shards dim 1 of a 1-d tensor"),
        (lambda: local_box((), (2,), [S(0)], (0,)), "placement S(0) shards dim 0 of a 0-d tensor"),
        (lambda: local_box((4,), (2,), [S(0)], (2,)), "coordinate [2] is outside mesh shape [2]"),
        (lambda: Shard("x"), "shard dim 'x' is not an integer"),
    ],
)
def test_errors(call, message):
    with pytest.raises(PlacementError) as info:
        call()
    assert message in str(info.value)
