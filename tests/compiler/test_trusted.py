"""The passes' trusted constructors (`trusted_copy`, `trusted_message`, `trusted_plan`, `Box._trusted`) build
the same values as the checked ones: equal, same hash, same fields and JSON, and a compiled
plan's ops and messages round-trip through the checked constructors of `plan_from_json`."""

from __future__ import annotations

import attrs

from tenplex.compiler import CopyOp, Message, Plan, compile_plan, dumps_plan, plan_from_json, plan_to_json
from tenplex.compiler.ops import trusted_copy
from tenplex.compiler.plan import trusted_message
from tenplex.ir import Box
from tenplex.ir.tensor import SubTensor, TensorMeta
from tests.compiler.test_verify import DST, OPTIONS, SRC


def test_trusted_copy_equals_the_checked_copy():
    box = Box((1, 0), (3, 4))
    for side in ("src", "dst"):
        fast = trusted_copy("w", box, 1, "a", 0, 2, "b", 3, side)
        slow = CopyOp("w", box, 1, "a", 0, 2, "b", 3, src_side=side)
        assert fast == slow and hash(fast) == hash(slow) and type(fast) is CopyOp
        assert attrs.asdict(fast, recurse=False) == attrs.asdict(slow, recurse=False)
    assert trusted_copy("w", box, 1, "a", 0, 2, "b", 3).src_side == "src"


def test_trusted_message_equals_the_checked_message():
    fast, slow = trusted_message(4, "h0", "h1", (7, 8), 96, 2), Message(4, "h0", "h1", (7, 8), 96, 2)
    assert fast == slow and hash(fast) == hash(slow) and attrs.asdict(fast) == attrs.asdict(slow)
    assert trusted_message(0, "h0", "h0", (1,), 8).round == 0


def test_trusted_boxes_equal_checked_boxes():
    for start, stop in [((), ()), ((0,), (0,)), ((2, 1), (5, 4))]:
        fast, slow = Box._trusted(start, stop), Box(start, stop)
        assert fast == slow and hash(fast) == hash(slow)
        assert (fast.shape, fast.volume) == (slow.shape, slow.volume)
    assert TensorMeta("w", (3, 2), "float32").box == Box((0, 0), (3, 2))
    assert SubTensor("s", "w", "p", (2, 0), ()).local_box == Box((0, 0), (2, 0))


def test_a_compiled_plan_round_trips_through_the_checked_constructors():
    plan = compile_plan(SRC, DST, OPTIONS)
    again = plan_from_json(plan_to_json(plan))
    assert again.ops == plan.ops and again.messages == plan.messages
    assert dumps_plan(again) == dumps_plan(plan)


def test_a_compiled_plan_equals_the_checked_plan_of_its_fields():
    plan = compile_plan(SRC, DST, OPTIONS)  # built by plan.trusted_plan
    fields = attrs.asdict(plan, recurse=False)
    checked = Plan(**fields)
    assert plan == checked and attrs.asdict(checked, recurse=False) == fields
    assert plan.round_of == checked.round_of and list(plan.graph.items()) == list(checked.graph.items())
