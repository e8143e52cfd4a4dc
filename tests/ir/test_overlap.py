"""Regions held more than once (`tenplex.ir.overlap`): named layouts, then random PTCs against
a numpy count of holders per element."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from tenplex.ir import PTC, Allocation, Box, Device, Partition, Piece, SubTensor, TensorMeta, Topology
from tenplex.ir.overlap import extra_elements, overlaps
from tests.problems import problems

W = TensorMeta("w", (8, 4), "float32")
TOPOLOGY = Topology((Device(0, "h0"), Device(1, "h0")))


def rows(sid: str, start: int, stop: int) -> SubTensor:
    box = Box((start, 0), (stop, 4))
    return SubTensor(sid, "w", "model/w", box.shape, [Piece(box, Box.from_shape(box.shape))])


def tied(sid: str) -> SubTensor:
    """Rows [0, 2) held twice by one sub-tensor, stacked locally."""
    box = Box((0, 0), (2, 4))
    return SubTensor(sid, "w", "model/w", (4, 4), [Piece(box, Box((0, 0), (2, 4))), Piece(box, Box((2, 0), (4, 4)))])


def ptc(*subs: SubTensor) -> PTC:
    parts = [Partition(f"p{i}", [s.id]) for i, s in enumerate(subs)]
    return PTC((W,), subs, parts, Allocation({p.id: [i % 2] for i, p in enumerate(parts)}), TOPOLOGY)


CASES = [
    ("tp_split", ptc(rows("a", 0, 4), rows("b", 4, 8)), {}, {}),
    ("dp_replicas_of_one_partition", PTC((W,), (rows("a", 0, 8),), (Partition("p", ["a"]),), Allocation({"p": [0, 1]}), TOPOLOGY), {}, {}),
    ("tp_replicated_norm", ptc(rows("a", 0, 8), rows("b", 0, 8)), {}, {"w": 32}),
    ("tied_within_one_subtensor", ptc(tied("a"), rows("b", 2, 8)), {}, {"w": 8}),
    ("split_two_ways", ptc(rows("a", 0, 6), rows("b", 4, 8)), {"w": [("a", Box((0, 0), (6, 4)), "b", Box((4, 0), (8, 4)), Box((4, 0), (6, 4)))]}, {"w": 8}),
]  # fmt: skip


@pytest.mark.parametrize("layout, want_overlaps, want_extra", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_named_layouts(layout, want_overlaps, want_extra):
    got = {t: [(o.a[0], o.a[1], o.b[0], o.b[1], o.common) for o in found] for t, found in overlaps(layout).items()}
    assert got == want_overlaps
    assert extra_elements(layout) == want_extra


@given(problems())
def test_extra_elements_and_overlaps_match_a_count_of_holders(problem):
    for ptc_ in problem:
        extra = extra_elements(ptc_)
        found = overlaps(ptc_, limit=1000)
        for meta in ptc_.tensors:
            count = np.zeros(meta.shape, dtype=int)
            boxes = set()
            for st in ptc_.by_tensor[meta.name]:
                for p in st.pieces:
                    count[p.global_box.to_slices() + (...,)] += 1
                    boxes.add(p.global_box)
            assert extra.get(meta.name, 0) == int(np.maximum(count - 1, 0).sum())
            partial = {(a, b) for a in boxes for b in boxes if a < b and a.overlaps(b)}
            assert {(o.a[1], o.b[1]) if o.a[1] < o.b[1] else (o.b[1], o.a[1]) for o in found.get(meta.name, [])} == partial
