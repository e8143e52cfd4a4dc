"""`describe` never calls an overlapping PTC complete: it names the tensor, the two sub-tensors,
their boxes and the region both hold (`tenplex inspect` of such a PTC said "complete")."""

from __future__ import annotations

from tenplex.compiler.emit.describe import describe
from tests.ir.test_overlap import ptc, rows, tied


def test_overlapping_subtensors_are_named_not_complete():
    out = describe(ptc(rows("w/a", 0, 6), rows("w/b", 4, 8)))
    assert ("overlapping: tensor 'w' is held by sub-tensors whose boxes overlap without being equal: "
            "'w/a' [[0, 6], [0, 4]] and 'w/b' [[4, 8], [0, 4]] both hold [[4, 6], [0, 4]]") in out  # fmt: skip
    assert "held twice: 1 tensor(s) have elements held by more than one sub-tensor" in out and "32 B beyond one copy: w" in out
    assert "complete" not in out


def test_equal_boxes_are_held_twice_but_not_overlapping():
    out = describe(ptc(rows("w/a", 0, 8), rows("w/b", 0, 8)))
    assert "overlapping" not in out and "128 B beyond one copy: w" in out
    out = describe(ptc(tied("w/a"), rows("w/b", 2, 8)))
    assert "overlapping" not in out and "32 B beyond one copy: w" in out


def test_a_plain_split_is_complete():
    assert "none: the PTC is complete, without fill or replicas" in describe(ptc(rows("w/a", 0, 4), rows("w/b", 4, 8)))
