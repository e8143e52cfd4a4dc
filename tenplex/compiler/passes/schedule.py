"""`schedule`: put messages in rounds.

Network messages go first-fit, largest first, into the earliest round where neither end's
buffers (bytes sent plus bytes received in that round) exceed `memory_budget_bytes`; this also
spreads NIC load over rounds. Local messages run in round 0; a forward message runs in the round
after the message that delivered its data.
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from tenplex.compiler.program import Program


@attrs.frozen
class Schedule:
    name = "schedule"
    requires = frozenset({"messages"})
    provides = frozenset({"scheduled"})

    def apply(self, program: Program) -> Program:
        budget = program.options.memory_budget_bytes
        messages = list(program.messages)
        message_of = {op: m.id for m in messages for op in m.ops}
        rounds: dict[int, int] = {}
        used: list[dict[str, int]] = []
        first_open: dict[str, int] = defaultdict(int)  # rounds before it are full for the host
        network = sorted((m for m in messages if m.src_host != m.dst_host), key=lambda m: (-m.bytes, m.id))
        for m in network:
            r = max(first_open[m.src_host], first_open[m.dst_host])
            while r < len(used) and (used[r][m.src_host] + m.bytes > budget or used[r][m.dst_host] + m.bytes > budget):
                r += 1
            if r == len(used):
                used.append(defaultdict(int))
            for h in (m.src_host, m.dst_host):
                used[r][h] += m.bytes
                while first_open[h] < len(used) and used[first_open[h]][h] >= budget:
                    first_open[h] += 1
            rounds[m.id] = r
        for m in messages:
            if m.id not in rounds:
                deps = {message_of[p] for op in m.ops for p in program.graph.predecessors(op)}
                rounds[m.id] = max((rounds[d] + 1 for d in deps), default=0)
        return attrs.evolve(program, messages=tuple(attrs.evolve(m, round=rounds[m.id]) for m in messages))
