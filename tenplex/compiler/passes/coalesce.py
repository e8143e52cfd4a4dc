"""`coalesce`: group copies into messages of at most `max_message_bytes`.

(A copy within one device is never cut: runtimes execute it as an in-place view or one memcpy
with no message buffer, so a local message holding one may exceed the limit.)

Three kinds of message, each packed in op order: network copies per (src host, dst host);
local copies per host (src state read on the same host); forwards per landing message (they
can only run after it). Fills and values travel in no message.
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from tenplex.compiler.ops import CopyOp
from tenplex.compiler.plan import Message
from tenplex.compiler.program import Program


@attrs.frozen
class Coalesce:
    name = "coalesce"
    requires = frozenset({"sources"})
    provides = frozenset({"messages"})

    def apply(self, program: Program) -> Program:
        graph = program.graph
        groups: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        message_of: dict[int, int] = {}
        packer = _Packer(program.options.max_message_bytes)
        for key, op in graph.items():
            if not isinstance(op, CopyOp):
                continue
            if op.src_side == "src":
                hosts = program.host_of(op.src_device), program.host_of(op.dst_device)
                groups[hosts].append((key, op.box.volume * program.itemsize(op.tensor)))
        for (src_host, dst_host), ops in groups.items():
            for m in packer.pack(src_host, dst_host, ops):
                message_of.update(dict.fromkeys(m.ops, m.id))
        forwards: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for key, op in graph.items():
            if isinstance(op, CopyOp) and op.src_side == "dst":
                (landing,) = graph.predecessors(key)
                forwards[message_of[landing]].append((key, op.box.volume * program.itemsize(op.tensor)))
        for landing_msg, ops in forwards.items():
            host = packer.messages[landing_msg].dst_host
            packer.pack(host, host, ops)
        return attrs.evolve(program, messages=tuple(packer.messages))


class _Packer:
    def __init__(self, limit: int):
        self.limit = limit
        self.messages: list[Message] = []

    def pack(self, src_host: str, dst_host: str, ops: list[tuple[int, int]]) -> list[Message]:
        out, batch, size = [], [], 0
        for key, nbytes in ops + [(-1, self.limit + 1)]:
            if batch and (key < 0 or size + nbytes > self.limit):
                m = Message(len(self.messages), src_host, dst_host, tuple(batch), size)
                self.messages.append(m)
                out.append(m)
                batch, size = [], 0
            if key >= 0:
                batch.append(key)
                size += nbytes
        return out
