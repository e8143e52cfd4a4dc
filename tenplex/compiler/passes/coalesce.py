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
from tenplex.compiler.plan import Message, trusted_message
from tenplex.compiler.program import Program


@attrs.frozen
class Coalesce:
    name = "coalesce"
    requires = frozenset({"sources"})
    provides = frozenset({"messages"})

    def apply(self, program: Program) -> Program:
        graph = program.graph
        host = {d.id: d.host for d in program.topology.devices}
        size = program.dst.itemsizes
        groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        forwards: list[tuple[int, int]] = []
        for key, op in graph.items():
            if isinstance(op, CopyOp):
                item = (key, op.box.volume * size[op.tensor])
                if op.src_side == "src":
                    groups[(host[op.src_device], host[op.dst_device])].append(item)
                else:
                    forwards.append(item)
        packer = _Packer(program.options.max_message_bytes)
        message_of: dict[int, int] = {}
        for (src_host, dst_host), ops in groups.items():
            for m in packer.pack(src_host, dst_host, ops):
                message_of.update(dict.fromkeys(m.ops, m.id))
        after: dict[int, list[tuple[int, int]]] = defaultdict(list)  # landing message -> forwards
        for key, nbytes in forwards:
            (landing,) = graph.predecessors(key)
            after[message_of[landing]].append((key, nbytes))
        for landing_msg, ops in after.items():
            dst_host = packer.messages[landing_msg].dst_host
            packer.pack(dst_host, dst_host, ops)
        return attrs.evolve(program, messages=tuple(packer.messages))


class _Packer:
    def __init__(self, limit: int):
        self.limit = limit
        self.messages: list[Message] = []

    def pack(self, src_host: str, dst_host: str, ops: list[tuple[int, int]]) -> list[Message]:
        out: list[Message] = []
        batch: list[int] = []
        size, limit = 0, self.limit
        for key, nbytes in ops:
            if batch and size + nbytes > limit:
                out.append(self._emit(src_host, dst_host, batch, size))
                batch, size = [], 0
            batch.append(key)
            size += nbytes
        if batch:
            out.append(self._emit(src_host, dst_host, batch, size))
        return out

    def _emit(self, src_host: str, dst_host: str, batch: list[int], size: int) -> Message:
        m = trusted_message(len(self.messages), src_host, dst_host, tuple(batch), size)
        self.messages.append(m)
        return m
