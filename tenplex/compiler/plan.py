"""The frozen `Plan` and its `tenplex.plan/1` JSON form.

A plan lists ops (index = op id), order edges between them, messages (ops grouped by host
pair, each in a round), the dst allocation it realizes, the options it was compiled with, and
stats. Runtimes execute rounds in order; within a round, messages are independent.

Invariants checked here, when a plan is built: every field has its type (ints are ints, not
bools or strings; ops are ops; edges are pairs of op ids); message ids are unique. Checked by
`check_plan`, not here: every copy op is in exactly one message whose hosts are its devices'
hosts; an order edge goes to a later round; the stats are the ops' own.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

import attrs

from tenplex.compiler.graph import EdgeKind, OpGraph
from tenplex.compiler.ops import CopyOp, FillOp, Op, ValueOp, check_types
from tenplex.ir.errors import IRError
from tenplex.ir.files import read_json
from tenplex.ir.ptc import Allocation
from tenplex.ir.serialize import JsonDoc, canonical_text

FORMAT = "tenplex.plan/1"
MiB = 1 << 20


@attrs.frozen
class CompileOptions:
    place_ranks: bool = True
    max_message_bytes: int = 64 * MiB
    memory_budget_bytes: int = 1024 * MiB
    baseline: str | None = None  # "reference": source choice of the reference Tenplex (for comparison)

    def __attrs_post_init__(self) -> None:
        check_types("options", attrs.asdict(self), {"place_ranks": (bool,), "max_message_bytes": (int,), "memory_budget_bytes": (int,)})
        if self.max_message_bytes < 1 or self.memory_budget_bytes < self.max_message_bytes:
            raise IRError(f"need 1 <= max_message_bytes ({self.max_message_bytes}) <= memory_budget_bytes ({self.memory_budget_bytes})")
        if self.baseline not in (None, "reference"):
            raise IRError(f"unknown baseline {self.baseline!r}; known: reference")


@attrs.frozen
class Message:
    id: int
    src_host: str
    dst_host: str
    ops: tuple[int, ...] = attrs.field(converter=tuple)
    bytes: int = 0
    round: int = 0

    def __attrs_post_init__(self) -> None:
        if not (type(self.id) is int and type(self.bytes) is int and type(self.round) is int
                and type(self.src_host) is str and type(self.dst_host) is str):  # fmt: skip
            check_types("message", attrs.asdict(self), {"id": (int,), "src_host": (str,), "dst_host": (str,), "bytes": (int,), "round": (int,)})
        for i in self.ops:
            if type(i) is not int:
                raise IRError(f"message {self.id} lists op {i!r}; expected an op id (an int)")


_MESSAGE_SET = tuple(Message.__dict__[f.name].__set__ for f in attrs.fields(Message))


def trusted_message(id: int, src_host: str, dst_host: str, ops: tuple[int, ...], nbytes: int, round: int = 0) -> Message:
    """A `Message` from fields the compiler's passes built (ints, host names, a tuple of op
    ids): sets the slots without `__init__`'s checks (plan files never come through here)."""
    m = object.__new__(Message)
    set_id, set_src, set_dst, set_ops, set_bytes, set_round = _MESSAGE_SET
    set_id(m, id)
    set_src(m, src_host)
    set_dst(m, dst_host)
    set_ops(m, ops)
    set_bytes(m, nbytes)
    set_round(m, round)
    return m


@attrs.frozen
class Stats:
    device_bytes: int
    host_bytes: int
    network_bytes: int
    fill_bytes: int
    network_lower_bound_bytes: int
    predicted_seconds: float
    lower_bound_seconds: float
    rounds: int

    def __attrs_post_init__(self) -> None:
        fields = attrs.asdict(self)
        seconds = {"predicted_seconds", "lower_bound_seconds"}
        check_types("stats", fields, {k: (int, float) if k in seconds else (int,) for k in fields})

    def to_json(self) -> dict:
        return {
            "bytes_by_class": {"device": self.device_bytes, "host": self.host_bytes, "network": self.network_bytes},
            "fill_bytes": self.fill_bytes,
            "network_lower_bound_bytes": self.network_lower_bound_bytes,
            "predicted_seconds": self.predicted_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "rounds": self.rounds,
        }

    @classmethod
    def from_json(cls, node: dict) -> Stats:
        by = node["bytes_by_class"]
        rest = {k: v for k, v in node.items() if k != "bytes_by_class"}
        return cls(device_bytes=by["device"], host_bytes=by["host"], network_bytes=by["network"], **rest)


@attrs.frozen
class Plan:
    ops: tuple[Op, ...] = attrs.field(converter=tuple)
    edges: tuple[tuple[int, int], ...] = attrs.field(converter=tuple)
    messages: tuple[Message, ...] = attrs.field(converter=tuple)
    allocation: Allocation
    options: CompileOptions
    stats: Stats

    def __attrs_post_init__(self) -> None:
        parts = {"allocation": (Allocation,), "options": (CompileOptions,), "stats": (Stats,)}
        check_types("plan", {k: getattr(self, k) for k in parts}, parts)
        for i, op in enumerate(self.ops):
            if not isinstance(op, (CopyOp, FillOp, ValueOp)):
                raise IRError(f"plan op {i} is {op!r}; expected a copy, fill or value op")
        for e in self.edges:
            if not (isinstance(e, tuple) and len(e) == 2 and type(e[0]) is int and type(e[1]) is int):
                raise IRError(f"plan edge {e!r} is not a pair of op ids")
        ids = set()
        for m in self.messages:
            if not isinstance(m, Message):
                raise IRError(f"plan message {m!r} is not a Message")
            if m.id in ids:
                raise IRError(f"message id {m.id} is used twice")
            ids.add(m.id)

    @cached_property
    def graph(self) -> OpGraph:
        """The frozen op graph (node key = op id)."""
        g = OpGraph()
        g.add_all(self.ops)
        for a, b in self.edges:
            g.add_edge(a, b, EdgeKind.ORDER)
        return g.freeze()

    @cached_property
    def round_of(self) -> dict[int, int]:
        """Op id -> round of its message (ops in no message run in round 0)."""
        return {op: m.round for m in self.messages for op in m.ops}


_PLAN_SET = tuple(Plan.__dict__[f.name].__set__ for f in attrs.fields(Plan))  # slot setters, in field order


def trusted_plan(ops: tuple[Op, ...], edges: tuple[tuple[int, int], ...], messages: tuple[Message, ...],
                 allocation: Allocation, options: CompileOptions, stats: Stats) -> Plan:  # fmt: skip
    """A `Plan` from the tuples `compile.freeze` built out of the passes' trusted ops and
    messages: sets the slots without `__init__`'s per-op type checks (plan files never come
    through here, and `check_plan` proves every op of a compiled plan)."""
    plan = object.__new__(Plan)
    for set_field, value in zip(_PLAN_SET, (ops, edges, messages, allocation, options, stats)):
        set_field(plan, value)
    return plan


def _op_json(i: int, op: Op) -> dict[str, Any]:
    if isinstance(op, CopyOp):
        out = {"id": i, "kind": "copy", "tensor": op.tensor, "box": op.box.to_list(),
               "src_device": op.src_device, "src_subtensor": op.src_subtensor, "src_piece": op.src_piece,
               "dst_device": op.dst_device, "dst_subtensor": op.dst_subtensor, "dst_piece": op.dst_piece}  # fmt: skip
        if op.src_side != "src":
            out["src_side"] = op.src_side
        return out
    if isinstance(op, FillOp):
        return {"id": i, "kind": "fill", "dst_device": op.dst_device, "dst_subtensor": op.dst_subtensor,
                "box": op.box.to_list(), "value": op.value}  # fmt: skip
    out = {"id": i, "kind": "value", "dst_device": op.dst_device, "dst_partition": op.dst_partition, "name": op.name}
    if op.src_partition is not None:
        out.update(src_device=op.src_device, src_partition=op.src_partition)
    else:
        out["value"] = op.value
    return out


def plan_to_json(plan: Plan) -> dict:
    return {
        "format": FORMAT,
        "options": attrs.asdict(plan.options),
        "stats": plan.stats.to_json(),
        "allocation": {pid: list(devs) for pid, devs in plan.allocation.items},
        "messages": [attrs.asdict(m) | {"ops": list(m.ops)} for m in plan.messages],
        "edges": [[a, b, "order"] for a, b in plan.edges],
        "ops": [_op_json(i, op) for i, op in enumerate(plan.ops)],
    }


def dumps_plan(plan: Plan) -> str:
    return canonical_text(plan_to_json(plan))


_COPY_KEYS = ("id", "kind", "tensor", "box", "src_device", "src_subtensor", "src_piece", "dst_device", "dst_subtensor", "dst_piece")


def _op_from_json(doc: JsonDoc, i: int, node: Any) -> Op:
    w = f"ops[{i}]"
    kind = node.get("kind") if isinstance(node, dict) else None
    if kind == "copy":
        doc.obj(node, w, _COPY_KEYS, ("src_side",))
        fields = {k: node[k] for k in _COPY_KEYS[2:]} | {"box": doc.box(node["box"], w + ".box")}
        return doc.build(w, lambda: CopyOp(src_side=node.get("src_side", "src"), **fields))
    if kind == "fill":
        doc.obj(node, w, ("id", "kind", "dst_device", "dst_subtensor", "box", "value"))
        box = doc.box(node["box"], w + ".box")
        return doc.build(w, lambda: FillOp(node["dst_device"], node["dst_subtensor"], box, node["value"]))
    if kind == "value":
        doc.obj(node, w, ("id", "kind", "dst_device", "dst_partition", "name"), ("src_device", "src_partition", "value"))
        return doc.build(w, lambda: ValueOp(node["dst_device"], node["dst_partition"], node["name"],
                                            node.get("src_device"), node.get("src_partition"), node.get("value")))  # fmt: skip
    raise doc.fail(w, f"unknown op kind {kind!r} (expected copy, fill or value)")


_STATS_KEYS = ("bytes_by_class", "fill_bytes", "network_lower_bound_bytes", "predicted_seconds", "lower_bound_seconds", "rounds")


def _stats_from_json(doc: JsonDoc, node: Any) -> Stats:
    doc.obj(node, "stats", _STATS_KEYS)
    doc.obj(node["bytes_by_class"], "stats.bytes_by_class", ("device", "host", "network"))
    return doc.build("stats", lambda: Stats.from_json(node))


def _is_id(x: Any, n: int) -> bool:
    return type(x) is int and 0 <= x < n


def plan_from_json(root: Any, source: str = "<plan>") -> Plan:
    """Parse a `tenplex.plan/1` document. Raises ParseError naming the field, and nothing else."""
    doc = JsonDoc(source)
    doc.obj(root, "document", ("format", "options", "stats", "allocation", "messages", "edges", "ops"))
    if root["format"] != FORMAT:
        raise doc.fail("format", f"expected {FORMAT!r}, got {root['format']!r}")
    ops = []
    for i, node in enumerate(doc.typed(root["ops"], "ops", list, "a list of ops")):
        if not isinstance(node, dict) or type(node.get("id")) is not int or node["id"] != i:
            raise doc.fail(f"ops[{i}]", f"expected an op object with id {i}")
        ops.append(_op_from_json(doc, i, node))
    edges = []
    for i, e in enumerate(doc.typed(root["edges"], "edges", list, "a list of edges")):
        if not (isinstance(e, list) and len(e) == 3 and e[2] == "order" and all(_is_id(x, len(ops)) for x in e[:2])):
            raise doc.fail(f"edges[{i}]", f"expected [src_op, dst_op, \"order\"] with op ids < {len(ops)}, got {e!r}")
        edges.append((e[0], e[1]))
    messages, ids = [], set()
    for i, m in enumerate(doc.typed(root["messages"], "messages", list, "a list of messages")):
        doc.obj(m, f"messages[{i}]", ("id", "src_host", "dst_host", "ops", "bytes", "round"))
        doc.typed(m["ops"], f"messages[{i}].ops", list, "a list of op ids")
        messages.append(doc.build(f"messages[{i}]", lambda m=m: Message(**m)))
        if m["id"] in ids:
            raise doc.fail(f"messages[{i}].id", f"message id {m['id']} is used twice")
        ids.add(m["id"])
    options = doc.build("options", lambda: CompileOptions(**doc.obj(root["options"], "options", (), tuple(attrs.fields_dict(CompileOptions)))))
    stats = _stats_from_json(doc, root["stats"])
    alloc = doc.build("allocation", lambda: Allocation(doc.typed(root["allocation"], "allocation", dict, "an object")))
    return doc.build("document", lambda: Plan(tuple(ops), tuple(edges), tuple(messages), alloc, options, stats))


def load_plan(path: str | os.PathLike) -> Plan:
    return plan_from_json(read_json(path), str(path))


