"""`plan_from_json` on malformed plan documents: one named case per way a field can be wrong.

Every case edits the JSON of one valid plan (the plan of tests/compiler/test_verify.py) and
expects a one-line ParseError that names the field and the value. The plan IR refuses the same
values when built in code (`test_ir_refuses_*`).
"""

from __future__ import annotations

import json

import attrs
import pytest

from tenplex.compiler import (
    CompileOptions,
    CopyOp,
    FillOp,
    Message,
    ValueOp,
    compile_plan,
    plan_from_json,
    plan_to_json,
)
from tenplex.ir import Allocation, Box, IRError, ParseError
from tests.compiler.test_verify import DST, OPTIONS, SRC


@pytest.fixture(scope="module")
def doc() -> dict:
    return plan_to_json(compile_plan(SRC, DST, OPTIONS))


def _set(path: str, value):
    """An edit that sets the node at `path` (keys and indices separated by dots)."""

    def edit(doc: dict) -> None:
        *parents, last = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
        node = doc
        for k in parents:
            node = node[k]
        node[last] = value

    return edit


def _delete(path: str):
    def edit(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for k in parents:
            node = node[int(k) if k.isdigit() else k]
        del node[last]

    return edit


def _op_of(kind: str, doc: dict) -> int:
    return next(op["id"] for op in doc["ops"] if op["kind"] == kind)


CASES = [
    ("stats_seconds_is_a_string", _set("stats.predicted_seconds", "4e-12"), "stats: stats field 'predicted_seconds' is '4e-12'; expected int or float"),
    ("stats_bytes_is_a_bool", _set("stats.fill_bytes", True), "stats: stats field 'fill_bytes' is True; expected int"),
    ("stats_missing_rounds", _delete("stats.rounds"), "stats: missing key 'rounds'"),
    ("stats_is_a_list", _set("stats", []), "stats: expected an object, got list"),
    ("stats_bytes_by_class_lacks_host", _delete("stats.bytes_by_class.host"), "stats.bytes_by_class: missing key 'host'"),
    ("message_id_twice", _set("messages.1.id", 0), "messages[1].id: message id 0 is used twice"),
    ("message_ops_a_string", _set("messages.0.ops", "4"), "messages[0].ops: expected a list of op ids, got '4'"),
    ("message_op_id_a_string", _set("messages.0.ops", ["4"]), "messages[0]: message 0 lists op '4'; expected an op id (an int)"),
    ("message_round_a_float", _set("messages.0.round", 0.0), "messages[0]: message field 'round' is 0.0; expected int"),
    ("message_host_a_number", _set("messages.0.src_host", 0), "messages[0]: message field 'src_host' is 0; expected str"),
    ("op_id_a_bool", _set("ops.1.id", True), "ops[1]: expected an op object with id 1"),
    ("copy_device_a_string", _set("ops.4.src_device", "0"), "ops[4]: copy field 'src_device' is '0'; expected int"),
    ("copy_piece_a_bool", _set("ops.4.dst_piece", False), "ops[4]: copy field 'dst_piece' is False; expected int"),
    ("copy_box_float", _set("ops.4.box", [[0, 2.0], [0, 4]]), "ops[4].box: box coordinate 2.0 is not an integer"),
    ("copy_box_reversed", _set("ops.4.box", [[2, 0], [0, 4]]), "ops[4].box: box [[2, 0], [0, 4]] has an interval [2, 0) that is negative or reversed"),
    ("fill_value_a_string", _set("ops.0.value", "-1"), "ops[0]: fill field 'value' is '-1'; expected int or float"),
    ("value_op_both_copied_and_literal", _set("ops.2.value", 8), "ops[2]: value op for 'iteration' copies from src partition 's' and also carries the literal 8"),
    ("value_op_src_device_without_partition", _delete("ops.2.src_partition"), "ops[2]: value op for 'iteration' has src_device 0 and src_partition None; give both or neither"),
    ("edge_of_bools", _set("edges.0", [True, 5, "order"]), "edges[0]: expected [src_op, dst_op, \"order\"] with op ids < 12, got [True, 5, 'order']"),
    ("allocation_device_a_string", _set("allocation.r", ["2", 3]), "allocation: partition 'r' is allocated to device '2', which is not an integer device id"),
    ("allocation_devices_a_string", _set("allocation.r", "23"), "allocation: partition 'r' is allocated to '23'; expected a list of device ids"),
    ("options_place_ranks_a_string", _set("options.place_ranks", "yes"), "options: options field 'place_ranks' is 'yes'; expected bool"),
    ("options_budget_a_float", _set("options.memory_budget_bytes", 64.0), "options: options field 'memory_budget_bytes' is 64.0; expected int"),
]  # fmt: skip


@pytest.mark.parametrize("edit, message", [pytest.param(e, m, id=n) for n, e, m in CASES])
def test_malformed_plan_json_is_a_parse_error_naming_the_field(doc, edit, message):
    broken = json.loads(json.dumps(doc))
    edit(broken)
    with pytest.raises(ParseError) as e:
        plan_from_json(broken)
    assert str(e.value) == f"<plan>: {message}"


def test_the_base_plan_parses(doc):
    assert plan_to_json(plan_from_json(doc)) == doc
    assert doc["ops"][_op_of("copy", doc)]["id"] == 4 and doc["ops"][_op_of("value", doc)]["id"] == 2


BOX = Box((0, 0), (2, 4))
IR_CASES = [
    ("copy_device_a_bool", lambda: CopyOp("w", BOX, True, "w/s", 0, 2, "w/r", 0), "copy field 'src_device' is True; expected int"),
    ("copy_box_a_list", lambda: CopyOp("w", [[0, 2]], 0, "w/s", 0, 2, "w/r", 0), "copy field 'box' is [[0, 2]]; expected Box"),
    ("fill_device_none", lambda: FillOp(None, "w/r", BOX, 0), "fill field 'dst_device' is None; expected int"),
    ("value_name_a_number", lambda: ValueOp(2, "r", 7), "value op field 'name' is 7; expected str"),
    ("message_ops_of_floats", lambda: Message(0, "h0", "h1", (1.0,)), "message 0 lists op 1.0; expected an op id (an int)"),
    ("allocation_partition_a_number", lambda: Allocation({7: [0]}), "allocation partition id 7 is not a string"),
    ("options_baseline_unknown", lambda: CompileOptions(baseline="fast"), "unknown baseline 'fast'; known: reference"),
]  # fmt: skip


@pytest.mark.parametrize("build, message", [pytest.param(b, m, id=n) for n, b, m in IR_CASES])
def test_ir_refuses_malformed_plan_values(build, message):
    with pytest.raises(IRError) as e:
        build()
    assert str(e.value) == message


def test_ir_refuses_a_plan_with_two_messages_of_one_id(doc):
    plan = plan_from_json(doc)
    with pytest.raises(IRError, match="message id 0 is used twice"):
        attrs.evolve(plan, messages=plan.messages + (plan.messages[0],))
