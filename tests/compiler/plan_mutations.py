"""Hypothesis strategies that break real plans: `mutated(plan, src, dst)`.

A mutation changes one thing: a field of an op (boxes with extra or missing dims, shifted,
grown, emptied, reversed; devices, sub-tensor ids, pieces, src_side, fill values, value ops),
the op list (drop, duplicate, reorder with or without renumbering), messages (membership,
rounds, hosts, bytes, ids), order edges, the allocation, the options or the stats. Values are
drawn from the plan's own vocabulary (real ids, devices, hosts) and from junk of every JSON type.

Most mutations would be caught at once by a message's byte count or the stats; `repair` then
recounts both (as a careless or malicious author would), so that the deeper checks get hit.
"""

from __future__ import annotations

from collections import Counter

import attrs
from hypothesis import strategies as st

from tenplex.compiler import CopyOp, FillOp
from tenplex.compiler.plan import Plan
from tenplex.ir import PTC, Box, TenplexError
from tests.compiler.plan_judge import _stats

JUNK = ("0", 1.5, True, None, [0], "", "\x00", -1, 2**64)


def _ints(upper: int) -> st.SearchStrategy:
    return st.integers(-1, upper + 1) | st.sampled_from(JUNK)


def _box(draw, box: Box, others: list[Box]) -> Box:
    """Box mutations; invalid coordinates raise IRError, as a parser would."""
    start, stop = list(box.start), list(box.stop)
    how = draw(st.sampled_from(["add_dim", "drop_dim", "shift", "grow", "shrink", "empty", "swap", "other", "huge"]))
    d = draw(st.integers(0, max(box.ndim - 1, 0)))
    if how == "add_dim":
        at, a = draw(st.integers(0, box.ndim)), draw(st.integers(0, 2))
        start.insert(at, a)
        stop.insert(at, a + draw(st.integers(1, 2)))
    elif how == "drop_dim" and box.ndim:
        del start[d], stop[d]
    elif how == "other" and others:
        return draw(st.sampled_from(others))
    elif box.ndim:
        k = draw(st.sampled_from([-2, -1, 1, 2]))
        if how == "shift":
            start[d], stop[d] = start[d] + k, stop[d] + k
        elif how == "grow":
            stop[d] += abs(k)
        elif how == "shrink":
            stop[d] -= abs(k)
        elif how == "empty":
            stop[d] = start[d]
        elif how == "swap":
            start[d], stop[d] = stop[d], start[d]
        else:
            stop[d] += 2**70
    return Box(tuple(start), tuple(stop))


class Vocabulary:
    """The ids, devices and hosts of a problem: what realistic mutations draw from."""

    def __init__(self, plan: Plan, src: PTC, dst: PTC):
        self.subtensors = sorted({s.id for s in src.subtensors} | {s.id for s in dst.subtensors})
        self.partitions = sorted({p.id for p in src.partitions} | {p.id for p in dst.partitions})
        self.tensors = sorted(t.name for t in dst.tensors)
        topology = src.topology.union(dst.topology)
        self.devices = max(d.id for d in topology.devices)
        self.hosts = list(topology.hosts) + ["elsewhere"]
        self.boxes = sorted({op.box for op in plan.ops if isinstance(op, (CopyOp, FillOp))})


def _field_value(draw, field: str, old, voc: Vocabulary):
    names = {"tensor": voc.tensors, "src_subtensor": voc.subtensors, "dst_subtensor": voc.subtensors,
             "dst_partition": voc.partitions, "src_partition": voc.partitions + [None],
             "name": ["iteration", "rng_state", "args", "x"], "src_side": ["src", "dst", "x"]}  # fmt: skip
    if field == "box":
        return _box(draw, old, voc.boxes)
    if field in names:
        return draw(st.sampled_from(names[field]) | st.sampled_from(JUNK))
    if field.endswith("_device"):
        return draw(_ints(voc.devices))
    if field.endswith("_piece"):
        return draw(_ints(3))
    return draw(st.sampled_from([0, 1, -1, 0.5, -2.25, 1.0, True, 7, "7", None, [7], {"a": 1}]))  # fill and op values


def _renumber(plan: Plan, order: list[int]) -> Plan:
    """Op `order[k]` becomes op k; edges and messages follow (ops not in `order` vanish)."""
    new = {old: k for k, old in enumerate(order)}
    return attrs.evolve(
        plan,
        ops=tuple(plan.ops[i] for i in order),
        edges=tuple((new[a], new[b]) for a, b in plan.edges if a in new and b in new),
        messages=tuple(attrs.evolve(m, ops=tuple(new[i] for i in m.ops if i in new)) for m in plan.messages),
    )


def _with_message(plan: Plan, k: int, **changes) -> Plan:
    messages = list(plan.messages)
    messages[k] = attrs.evolve(messages[k], **changes)
    return attrs.evolve(plan, messages=tuple(messages))


def _op(draw, plan: Plan, voc: Vocabulary) -> Plan:
    if not plan.ops:
        return plan
    i = draw(st.integers(0, len(plan.ops) - 1))
    op = plan.ops[i]
    field = draw(st.sampled_from([f.name for f in attrs.fields(type(op))]))
    ops = list(plan.ops)
    ops[i] = attrs.evolve(op, **{field: _field_value(draw, field, getattr(op, field), voc)})
    return attrs.evolve(plan, ops=tuple(ops))


def _op_list(draw, plan: Plan, voc: Vocabulary) -> Plan:
    n = len(plan.ops)
    if not n:
        return plan
    how = draw(st.sampled_from(["drop", "duplicate", "duplicate_listed", "permute", "swap", "replace"]))
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    if how == "drop":
        return _renumber(plan, [k for k in range(n) if k != i])
    if how == "permute":
        return _renumber(plan, draw(st.permutations(range(n))))
    ops = list(plan.ops)
    if how == "swap":
        ops[i], ops[j] = ops[j], ops[i]
    elif how == "replace":
        ops[i] = ops[j]
    else:
        ops.append(ops[i])
    out = attrs.evolve(plan, ops=tuple(ops))
    listed = [k for k, m in enumerate(plan.messages) if i in m.ops]
    if how == "duplicate_listed" and listed:
        out = _with_message(out, listed[0], ops=plan.messages[listed[0]].ops + (n,))
    return out


def _message(draw, plan: Plan, voc: Vocabulary) -> Plan:
    if not plan.messages:
        return plan
    k, j = draw(st.integers(0, len(plan.messages) - 1)), draw(st.integers(0, len(plan.messages) - 1))
    m, other = plan.messages[k], plan.messages[j]
    rounds = sorted({x.round for x in plan.messages})
    how = draw(st.sampled_from(["move", "remove", "add", "round", "src_host", "dst_host", "bytes", "id", "drop",
                                "duplicate", "reorder", "swap_ops", "index"]))  # fmt: skip
    messages = list(plan.messages)
    if how in ("move", "remove") and m.ops:
        i = draw(st.sampled_from(m.ops))
        messages[k] = attrs.evolve(m, ops=tuple(x for x in m.ops if x != i))
        if how == "move":
            messages[j] = attrs.evolve(messages[j], ops=messages[j].ops + (i,))
    elif how == "add":
        messages[k] = attrs.evolve(m, ops=m.ops + (draw(st.integers(0, len(plan.ops) - 1)),))
    elif how == "round":
        messages[k] = attrs.evolve(m, round=draw(st.sampled_from([-1, 0, rounds[-1] + 1, m.round + 1, m.round - 1, other.round])))
    elif how in ("src_host", "dst_host"):
        messages[k] = attrs.evolve(m, **{how: draw(st.sampled_from(voc.hosts) | st.sampled_from(JUNK))})
    elif how == "bytes":
        messages[k] = attrs.evolve(m, bytes=draw(st.sampled_from([m.bytes + 1, m.bytes - 1, 0, -1, 1.5, None])))
    elif how == "id":
        messages[k] = attrs.evolve(m, id=draw(st.sampled_from([other.id, -1, len(messages), "1", None])))
    elif how == "drop":
        del messages[k]
    elif how == "duplicate":
        messages.append(m)
    elif how == "reorder":
        messages = draw(st.permutations(messages))
    elif how == "swap_ops":
        messages[k], messages[j] = attrs.evolve(m, ops=other.ops), attrs.evolve(other, ops=m.ops)
    elif how == "index":
        messages[k] = attrs.evolve(m, ops=m.ops + (draw(st.sampled_from([-1, len(plan.ops), 1.0, "0", None])),))
    return attrs.evolve(plan, messages=tuple(messages))


def _edges(draw, plan: Plan, voc: Vocabulary) -> Plan:
    edges = list(plan.edges)
    n = len(plan.ops)
    how = draw(st.sampled_from(["drop", "add", "reverse", "duplicate", "junk"]))
    if how == "add" or not edges:
        edges.append((draw(st.integers(-1, n)), draw(st.integers(-1, n))))
    elif how == "junk":
        edges.append(draw(st.sampled_from([(0,), (0, "1"), (0.0, 1), None, (True, 0)])))
    else:
        k = draw(st.integers(0, len(edges) - 1))
        if how == "drop":
            del edges[k]
        elif how == "reverse":
            edges[k] = edges[k][::-1]
        else:
            edges.append(edges[k])
    return attrs.evolve(plan, edges=tuple(edges))


def _allocation(draw, plan: Plan, voc: Vocabulary) -> Plan:
    items = [(pid, list(devs)) for pid, devs in plan.allocation.items]
    k, j = draw(st.integers(0, len(items) - 1)), draw(st.integers(0, len(items) - 1))
    how = draw(st.sampled_from(["swap", "replace", "add", "remove", "rename", "junk"]))
    pid, devs = items[k]
    if how == "swap":
        items[k], items[j] = (pid, items[j][1]), (items[j][0], devs)
    elif how == "replace":
        devs[draw(st.integers(0, len(devs) - 1))] = draw(st.integers(0, voc.devices + 1))
    elif how == "add":
        devs.append(draw(st.integers(0, voc.devices + 1)))
    elif how == "remove":
        devs.pop()
    elif how == "rename":
        items[k] = (draw(st.sampled_from(voc.partitions + ["nobody", ""])), devs)
    else:
        items[k] = (pid, [draw(st.sampled_from(JUNK))])
    return attrs.evolve(plan, allocation=type(plan.allocation)(items))


def _numbers(draw, plan: Plan, voc: Vocabulary) -> Plan:
    """Stats or options: one field nudged, zeroed, doubled, or made junk."""
    which = draw(st.sampled_from(["stats", "options"]))
    obj = getattr(plan, which)
    fields = [f.name for f in attrs.fields(type(obj)) if which == "stats" or f.name.endswith("_bytes")]
    field = draw(st.sampled_from(fields))
    v = getattr(obj, field)
    new = draw(st.sampled_from([v + 1, v - 1, 0, 2 * v, v * 1.5, float(v), True, "1", None, -1]))
    return attrs.evolve(plan, **{which: attrs.evolve(obj, **{field: new})})


MUTATIONS = {"op": _op, "op_list": _op_list, "message": _message, "edges": _edges, "allocation": _allocation, "numbers": _numbers}


def repair(plan: Plan, src: PTC, dst: PTC) -> Plan:
    """Recount message bytes and stats from the (mutated) ops, where that is possible."""
    try:
        placed = dst.with_allocation(plan.allocation)
        size = lambda op: op.box.volume * placed.itemsize(placed.subtensor_map[op.dst_subtensor].tensor)  # noqa: E731
        messages = tuple(attrs.evolve(m, bytes=sum(size(plan.ops[i]) for i in m.ops)) for m in plan.messages)
        plan = attrs.evolve(plan, messages=messages)
        host = {d.id: d.host for d in src.topology.union(dst.topology).devices}
        return attrs.evolve(plan, stats=_stats(plan, src, placed, host))
    except (TenplexError, KeyError, IndexError, TypeError, AttributeError, ValueError):
        return plan


@st.composite
def mutated(draw, plan: Plan, src: PTC, dst: PTC) -> tuple[Plan | None, list[str]]:
    """(the plan after 1-3 mutations, their names); the plan is None when building it raised a
    TenplexError (the IR refused the value: fine, that is a refusal too)."""
    voc = Vocabulary(plan, src, dst)
    names = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3))
    try:
        for name in names:
            plan = MUTATIONS[name](draw, plan, voc)
    except TenplexError:
        return None, names
    if draw(st.booleans()):
        plan = repair(plan, src, dst)
    return plan, names


def op_counts(plan: Plan) -> Counter:
    return Counter(type(op).__name__ for op in plan.ops)
