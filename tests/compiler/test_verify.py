"""`check_plan` on broken plans: one named case per way a plan can be wrong.

Every case starts from one valid plan (src: `w` and a vocab-like `emb` on device 0 of host h0;
dst: both on the DP replicas 2 and 3 of host h1, `emb` padded with fill -1, the value
`iteration` inherited), breaks one thing with `attrs.evolve`, and expects a PlanVerifyError
whose message names what is wrong (tensor, sub-tensor, device, op, message or host).
"""

from __future__ import annotations

import attrs
import pytest

from tenplex.compiler import CompileOptions, CopyOp, FillOp, ValueOp, check_plan, compile_plan
from tenplex.compiler.verify import accepted_by_columns, check_plan_exact
from tenplex.ir import (
    PTC,
    Allocation,
    Box,
    Device,
    Partition,
    Piece,
    PlanVerifyError,
    SubTensor,
    TensorMeta,
    Topology,
    Value,
)

TOPOLOGY = Topology((Device(0, "h0"), Device(1, "h0"), Device(2, "h1"), Device(3, "h1")))
W = TensorMeta("w", (4, 4), "float32")
EMB = TensorMeta("emb", (6, 2), "float32")


def _whole(sid: str, meta: TensorMeta, shape=None, fill=0) -> SubTensor:
    return SubTensor(sid, meta.name, f"model/{meta.name}", shape or meta.shape, [Piece(meta.box, meta.box)], fill)


SRC = PTC((W, EMB), (_whole("w/s", W), _whole("emb/s", EMB)),
          (Partition("s", ["w/s", "emb/s"], {"iteration": Value(7)}),), Allocation({"s": [0]}), TOPOLOGY)  # fmt: skip
DST = PTC((W, EMB), (_whole("w/r", W), _whole("emb/r", EMB, (8, 2), -1)),
          (Partition("r", ["w/r", "emb/r"], {"iteration": Value(None)}),), Allocation({"r": [2, 3]}), TOPOLOGY)  # fmt: skip
OPTIONS = CompileOptions(place_ranks=False, max_message_bytes=32, memory_budget_bytes=64)


@pytest.fixture(scope="module")
def plan():
    return compile_plan(SRC, DST, OPTIONS)


# -- finding and changing ops -------------------------------------------------------------


def find(plan, kind=CopyOp, **fields) -> int:
    """The id of the one op of `kind` whose fields match."""
    hits = [i for i, op in enumerate(plan.ops) if isinstance(op, kind) and all(getattr(op, k) == v for k, v in fields.items())]
    assert len(hits) == 1, (fields, hits)
    return hits[0]


def landing(plan, tensor: str, row: int) -> int:
    """The network copy of `tensor` whose box starts at `row` (it lands on device 2)."""
    return next(i for i, op in enumerate(plan.ops) if isinstance(op, CopyOp) and op.src_side == "src" and op.tensor == tensor and op.box.start[0] == row)


def forward_of(plan, op_id: int) -> int:
    (fwd,) = [b for a, b in plan.edges if a == op_id]
    return fwd


def message_of(plan, op_id: int) -> int:
    (m,) = [k for k, m in enumerate(plan.messages) if op_id in m.ops]
    return m


def with_op(plan, i: int, **changes):
    ops = list(plan.ops)
    ops[i] = attrs.evolve(ops[i], **changes)
    return attrs.evolve(plan, ops=tuple(ops))


def with_message(plan, k: int, **changes):
    messages = list(plan.messages)
    messages[k] = attrs.evolve(messages[k], **changes)
    return attrs.evolve(plan, messages=tuple(messages))


def without_op(plan, i: int):
    """`plan` without op `i`, later ids renumbered in edges and messages."""
    new = lambda k: k - (k > i)  # noqa: E731
    return attrs.evolve(
        plan,
        ops=plan.ops[:i] + plan.ops[i + 1 :],
        edges=tuple((new(a), new(b)) for a, b in plan.edges if i not in (a, b)),
        messages=tuple(attrs.evolve(m, ops=tuple(new(k) for k in m.ops if k != i)) for m in plan.messages),
    )


# -- the broken plans ----------------------------------------------------------------------


def dropped_copy(plan):
    fwd = forward_of(plan, landing(plan, "w", 0))
    return without_op(plan, fwd), ["tensor 'w' sub-tensor 'w/r' on device 3", "piece 0 [[0, 4], [0, 4]] has 16 elements but the plan writes 8"]


def duplicated_copy(plan):
    i = landing(plan, "w", 0)
    return attrs.evolve(plan, ops=plan.ops + (plan.ops[i],)), ["tensor 'w' sub-tensor 'w/r' on device 2", "written twice at [[0, 2], [0, 4]]"]


def shifted_box(plan):
    """A landing and its forward both one row up: they overlap the copy before them."""
    i = landing(plan, "emb", 4)
    j = forward_of(plan, i)
    up = plan.ops[i].box.translate((-1, 0))
    broken = with_op(with_op(plan, i, box=up), j, box=up)
    return broken, ["tensor 'emb' sub-tensor 'emb/r' on device 2", "written twice at [[3, 4], [0, 2]]"]


def box_outside_dst_piece(plan):
    i = landing(plan, "w", 2)
    return with_op(plan, i, box=plan.ops[i].box.translate((1, 0))), [f"op {i} writes 'w' box [[3, 5], [0, 4]] outside dst piece [[0, 4], [0, 4]] of 'w/r'"]


def src_device_lacks_src(plan):
    i = landing(plan, "w", 0)
    return with_op(plan, i, src_device=1), [f"op {i} reads src sub-tensor 'w/s' on device 1, which does not hold it"]


def wrong_src_piece(plan):
    i = landing(plan, "w", 0)
    return with_op(plan, i, src_piece=1), [f"op {i} reads src piece 1 of sub-tensor 'w/s', which has 1 pieces"]


def src_piece_of_other_tensor(plan):
    i = landing(plan, "w", 0)
    return with_op(plan, i, src_subtensor="emb/s"), [f"op {i} reads 'w' box [[0, 2], [0, 4]] from src sub-tensor 'emb/s' piece 0, which holds 'emb' box [[0, 6], [0, 2]]"]


def dst_device_lacks_dst(plan):
    i = landing(plan, "w", 0)
    return with_op(plan, i, dst_device=1), [f"op {i} writes sub-tensor 'w/r' on device 1, which does not hold it"]


def forward_without_order_edge(plan):
    i = landing(plan, "w", 0)
    j = forward_of(plan, i)
    broken = attrs.evolve(plan, edges=tuple(e for e in plan.edges if e != (i, j)))
    return broken, [f"op {j} forwards 'w' box [[0, 2], [0, 4]] from dst 'w/r' on device 2", "no order-edge predecessor in an earlier round"]


def forward_after_no_op(plan):
    """Its only order edge comes from past the last op (or from -1, which Python would read as the last op)."""
    i = landing(plan, "w", 0)
    j = forward_of(plan, i)
    for source in (len(plan.ops), -1):
        broken = attrs.evolve(plan, edges=tuple(e for e in plan.edges if e != (i, j)) + ((source, j),))
        with pytest.raises(PlanVerifyError, match="no order-edge predecessor in an earlier round"):
            check_plan_exact(broken, SRC, DST)
    return broken, [f"op {j} forwards 'w' box [[0, 2], [0, 4]] from dst 'w/r' on device 2", "no order-edge predecessor"]


def forward_in_landing_round(plan):
    i = landing(plan, "w", 0)
    j = forward_of(plan, i)
    broken = with_message(plan, message_of(plan, j), round=plan.messages[message_of(plan, i)].round)
    return broken, [f"op {j} forwards 'w' box [[0, 2], [0, 4]] from dst 'w/r' on device 2", "in an earlier round"]


def order_cycle(plan):
    i = landing(plan, "w", 0)
    j = forward_of(plan, i)
    return attrs.evolve(plan, edges=plan.edges + ((j, i),)), [f"order edge {j} -> {i} does not go from an op to an op in a later round"]


def negative_round(plan):
    return with_message(plan, 0, round=-1), ["message 0 has negative round -1"]


def fill_with_wrong_value(plan):
    i = find(plan, FillOp, dst_device=2)
    return with_op(plan, i, value=0), [f"op {i} fills 'emb/r' local box [[6, 8], [0, 2]] with 0; expected fill -1"]


def fill_overlapping_piece(plan):
    i = find(plan, FillOp, dst_device=2)
    return with_op(plan, i, box=Box((5, 0), (8, 2))), ["fill of 'emb/r' on device 2 local box [[5, 8], [0, 2]] overlaps piece local box [[0, 6], [0, 2]]"]


def missing_fill(plan):
    return without_op(plan, find(plan, FillOp, dst_device=3)), ["tensor 'emb' sub-tensor 'emb/r' on device 3: fill region of shape (8, 2) has 4 elements but the plan writes 0"]


def missing_value_op(plan):
    return without_op(plan, find(plan, ValueOp, dst_device=3)), ["value 'iteration' of partition 'r' on device 3 is set 0 times"]


def literal_for_inherited_value(plan):
    i = find(plan, ValueOp, dst_device=2)
    return with_op(plan, i, src_device=None, src_partition=None, value=8), [f"op {i} sets value 'iteration' of 'r' to 8; dst wants it inherited from src"]


def message_with_wrong_bytes(plan):
    return with_message(plan, 0, bytes=plan.messages[0].bytes + 1), [f"message 0 says {plan.messages[0].bytes + 1} bytes but its ops hold {plan.messages[0].bytes}"]


def message_between_wrong_hosts(plan):
    (i,) = plan.messages[0].ops
    return with_message(plan, 0, src_host="h1"), [f"message 0 goes h1 -> h1 but op {i} goes h0 -> h1"]


def copy_in_no_message(plan):
    i = landing(plan, "w", 0)
    broken = with_message(plan, message_of(plan, i), ops=(), bytes=0)
    return broken, [f"copy op {i} ('w' box [[0, 2], [0, 4]] to device 2) is in 0 messages; expected 1"]


def copy_in_two_messages(plan):
    i = landing(plan, "w", 0)
    own = plan.messages[message_of(plan, i)]
    k, m = next((k, m) for k, m in enumerate(plan.messages) if m != own and (m.src_host, m.dst_host) == (own.src_host, own.dst_host))
    op_bytes = plan.ops[i].box.volume * 4  # float32
    broken = with_message(plan, k, ops=m.ops + (i,), bytes=m.bytes + op_bytes, round=own.round)
    return broken, [f"copy op {i} ('w' box [[0, 2], [0, 4]] to device 2) is in 2 messages; expected 1"]


def over_budget_round(plan):
    network = [k for k, m in enumerate(plan.messages) if m.src_host != m.dst_host]
    broken = plan
    for k in network:
        broken = with_message(broken, k, round=0)
    total = sum(plan.messages[k].bytes for k in network)
    return broken, [f"host h0 moves {total} network bytes in round 0, over the memory budget of 64"]


def allocation_with_other_replicas(plan):
    return attrs.evolve(plan, allocation=Allocation({"r": [2]})), ["plan allocation", "replica counts"]


def wrong_network_stats(plan):
    s = plan.stats
    broken = attrs.evolve(plan, stats=attrs.evolve(s, network_bytes=0))
    return broken, [f"plan stats say device/host/network bytes ({s.device_bytes}, {s.host_bytes}, 0) but its ops move ({s.device_bytes}, {s.host_bytes}, {s.network_bytes})"]


def wrong_rounds(plan):
    s = plan.stats
    return attrs.evolve(plan, stats=attrs.evolve(s, rounds=s.rounds + 1)), [f"plan stats say {s.rounds + 1} rounds but its messages use {s.rounds}"]


def wrong_network_lower_bound(plan):
    s = plan.stats
    broken = attrs.evolve(plan, stats=attrs.evolve(s, network_lower_bound_bytes=s.network_lower_bound_bytes - 16))
    return broken, [f"plan stats say network lower bound {s.network_lower_bound_bytes - 16} bytes; it is {s.network_lower_bound_bytes}"]


def wrong_fill_bytes(plan):
    s = plan.stats
    return attrs.evolve(plan, stats=attrs.evolve(s, fill_bytes=s.fill_bytes + 4)), ["fill bytes", str(s.fill_bytes + 4)]


def copy_box_with_extra_dim(plan):
    i = landing(plan, "w", 0)
    b = plan.ops[i].box
    return with_op(plan, i, box=Box(b.start + (0,), b.stop + (1,))), [f"op {i} copies 'w' box [[0, 2], [0, 4], [0, 1]] of 3 dims, but the tensor has 2 (shape (4, 4))"]


def copy_box_with_missing_dim(plan):
    i = landing(plan, "w", 0)
    b = plan.ops[i].box
    return with_op(plan, i, box=Box(b.start[:1], b.stop[:1])), [f"op {i} copies 'w' box [[0, 2]] of 1 dims, but the tensor has 2"]


def fill_box_with_extra_dim(plan):
    i = find(plan, FillOp, dst_device=2)
    b = plan.ops[i].box
    return with_op(plan, i, box=Box(b.start + (0,), b.stop + (1,))), [f"op {i} fills 'emb/r' local box [[6, 8], [0, 2], [0, 1]] with -1; expected fill -1 inside shape (8, 2)"]


def message_over_the_size_limit(plan):
    options = attrs.evolve(OPTIONS, max_message_bytes=16)
    k = next(k for k, m in enumerate(plan.messages) if m.bytes > 16)
    m = plan.messages[k]
    return attrs.evolve(plan, options=options), [f"message {m.id} holds {m.bytes} bytes in {len(m.ops)} ops, over max_message_bytes 16"]


def wrong_predicted_seconds(plan):
    s = plan.stats
    broken = attrs.evolve(plan, stats=attrs.evolve(s, predicted_seconds=s.predicted_seconds * 2))
    return broken, ["plan stats say predicted and lower-bound seconds", f"the cost model gives ({s.predicted_seconds!r}, {s.lower_bound_seconds!r})"]


def wrong_lower_bound_seconds(plan):
    s = plan.stats
    return attrs.evolve(plan, stats=attrs.evolve(s, lower_bound_seconds=0.0)), [f"plan stats say predicted and lower-bound seconds ({s.predicted_seconds!r}, 0.0)"]


CASES = [
    dropped_copy, duplicated_copy, shifted_box, box_outside_dst_piece, src_device_lacks_src, wrong_src_piece,
    src_piece_of_other_tensor, dst_device_lacks_dst, forward_without_order_edge, forward_after_no_op, forward_in_landing_round, order_cycle,
    negative_round, fill_with_wrong_value, fill_overlapping_piece, missing_fill, missing_value_op,
    literal_for_inherited_value, message_with_wrong_bytes, message_between_wrong_hosts, copy_in_no_message,
    copy_in_two_messages, over_budget_round, allocation_with_other_replicas, wrong_network_stats, wrong_rounds,
    wrong_network_lower_bound,
    wrong_fill_bytes, copy_box_with_extra_dim, copy_box_with_missing_dim, fill_box_with_extra_dim,
    message_over_the_size_limit, wrong_predicted_seconds, wrong_lower_bound_seconds,
]  # fmt: skip


def test_the_base_plan_verifies(plan):
    check_plan(plan, SRC, DST)
    check_plan_exact(plan, SRC, DST)
    assert accepted_by_columns(plan, SRC, DST)  # the fast path, not a fallback, verified it
    assert any(isinstance(op, CopyOp) and op.src_side == "dst" for op in plan.ops)
    assert len({m.round for m in plan.messages}) > 1


@pytest.mark.parametrize("breaks", CASES, ids=lambda f: f.__name__)
def test_broken_plan_is_rejected(plan, breaks):
    broken, expected = breaks(plan)
    assert not accepted_by_columns(broken, SRC, DST), f"{breaks.__name__}: the columns accepted the broken plan"
    try:
        check_plan(broken, SRC, DST)
    except PlanVerifyError as e:
        for part in expected:
            assert part in str(e), f"{part!r} not in {str(e)!r}"
    else:
        raise AssertionError(f"{breaks.__name__}: check_plan accepted the broken plan")



# -- inputs the plan does not fit ------------------------------------------------------------


def test_src_with_another_dtype_is_rejected(plan):
    w16 = attrs.evolve(W, dtype="float16")
    src = attrs.evolve(SRC, tensors=(w16, EMB))
    assert not accepted_by_columns(plan, src, DST)
    with pytest.raises(PlanVerifyError, match=r"op \d+ copies tensor 'w', which is float16\[4, 4\] in src but float32\[4, 4\] in dst"):
        check_plan(plan, src, DST)


def test_src_and_dst_placing_a_device_on_two_hosts_is_a_plan_verify_error(plan):
    moved = Topology((Device(0, "h0"), Device(1, "h0"), Device(2, "elsewhere"), Device(3, "h1")))
    assert not accepted_by_columns(plan, SRC, attrs.evolve(DST, topology=moved))
    with pytest.raises(PlanVerifyError, match="plan cannot be checked: device 2 is on host 'h1' in src but 'elsewhere' in dst"):
        check_plan(plan, SRC, attrs.evolve(DST, topology=moved))


def test_literal_value_of_another_json_type_is_rejected():
    """1.0 and True equal 1 in Python, but a job reading its iteration back gets another type."""
    dst = attrs.evolve(DST, partitions=(Partition("r", ["w/r", "emb/r"], {"iteration": Value(8)}),))
    plan = compile_plan(SRC, dst, OPTIONS)
    i = find(plan, ValueOp, dst_device=2)
    for other in (8.0, True, "8"):
        assert not accepted_by_columns(with_op(plan, i, value=other), SRC, dst)
        with pytest.raises(PlanVerifyError, match=rf"op {i} sets value 'iteration' of 'r' to {other!r}; dst wants 8"):
            check_plan(with_op(plan, i, value=other), SRC, dst)


# -- copies that only the exact sweep shows disjoint ---------------------------------------

PINWHEEL = [((0, 0), (3, 1)), ((3, 0), (4, 3)), ((1, 3), (4, 4)), ((0, 1), (1, 4)), ((1, 1), (3, 3))]


def split_copy(plan, i: int, boxes):
    """`plan` with copy op `i` replaced by copies of `boxes` (the first keeps its id and
    message; each other one gets a message of its own in the same round)."""
    ops, first = list(plan.ops), Box(*boxes[0])
    ops[i] = attrs.evolve(ops[i], box=first)
    ops += [attrs.evolve(plan.ops[i], box=Box(*b)) for b in boxes[1:]]
    k = message_of(plan, i)
    m, messages = plan.messages[k], list(plan.messages)
    messages[k] = attrs.evolve(m, bytes=m.bytes - 4 * (plan.ops[i].box.volume - first.volume))  # float32
    top = max(x.id for x in messages)
    for j, b in enumerate(boxes[1:], 1):
        messages.append(attrs.evolve(m, id=top + j, ops=(len(plan.ops) + j - 1,), bytes=4 * Box(*b).volume))
    return attrs.evolve(plan, ops=tuple(ops), messages=tuple(messages))


def test_a_piece_written_by_a_pinwheel_of_copies_verifies():
    """Five disjoint copies into one piece that no single dimension separates: the columns
    hand the group to the exact sweep, which accepts it and refuses an overlapping variant."""
    plan = compile_plan(SRC, SRC, OPTIONS)  # w stays on device 0: one device copy
    i = find(plan, CopyOp, tensor="w")
    pinwheel = split_copy(plan, i, PINWHEEL)
    check_plan_exact(pinwheel, SRC, SRC)
    assert accepted_by_columns(pinwheel, SRC, SRC)
    overlapping = split_copy(plan, i, PINWHEEL[:4] + [((0, 0), (2, 2))])  # same volume, overlaps
    assert not accepted_by_columns(overlapping, SRC, SRC)
    with pytest.raises(PlanVerifyError, match=r"sub-tensor 'w/s' on device 0: piece 0 \[\[0, 4\], \[0, 4\]\] is written twice"):
        check_plan(overlapping, SRC, SRC)
