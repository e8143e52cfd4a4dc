"""`schedule`: put messages in rounds.

Network messages are placed round by round so that no host's message buffers (bytes it sends
plus bytes it receives in a round) exceed `memory_budget_bytes`. In each round, host pairs whose
busiest end has the most bytes left (the hosts that bound the plan's time) take one message each
in turn while both ends have room, which spreads NIC load over all hosts. Local messages run in
round 0; a forward message runs in the round after the message that delivered its data.
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from tenplex.compiler.plan import trusted_message
from tenplex.compiler.program import Program


@attrs.frozen
class Schedule:
    name = "schedule"
    requires = frozenset({"messages"})
    provides = frozenset({"scheduled"})

    def apply(self, program: Program) -> Program:
        messages = program.messages
        network = [m for m in messages if m.src_host != m.dst_host]
        rounds = _network_rounds(network, program.options.memory_budget_bytes)
        message_of = {op: m.id for m in network for op in m.ops}  # forwards follow network landings
        predecessors = program.graph.predecessors
        for m in messages:
            if m.id not in rounds:
                deps = {message_of[p] for op in m.ops for p in predecessors(op)}
                rounds[m.id] = max((rounds[d] + 1 for d in deps), default=0)
        placed = tuple(m if m.round == rounds[m.id] else trusted_message(m.id, m.src_host, m.dst_host, m.ops, m.bytes, rounds[m.id])
                       for m in messages)  # fmt: skip
        return attrs.evolve(program, messages=placed)


def _network_rounds(network: list, budget: int) -> dict[int, int]:
    """Fill rounds one at a time: host pairs whose busiest end has the most bytes left go
    first, taking one message each in turn while both ends' buffers have room. Each direction
    of a host gets half the budget (NICs are full duplex, so a round is fastest when a host
    sends and receives equally), and both together never exceed it. Hosts are numbered in name
    order (so pairs of numbers sort as pairs of names) and counted in lists."""
    half = max([budget // 2] + [m.bytes for m in network])
    names = sorted({h for m in network for h in (m.src_host, m.dst_host)})
    ix = {h: i for i, h in enumerate(names)}
    queues: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (bytes, message id)
    left = [0] * len(names)
    for m in sorted(network, key=lambda m: (-m.bytes, m.id)):
        src, dst = ix[m.src_host], ix[m.dst_host]
        queues[(src, dst)].append((m.bytes, m.id))
        left[src] += m.bytes
        left[dst] += m.bytes
    for q in queues.values():
        q.reverse()  # pop() takes the largest
    rounds: dict[int, int] = {}
    r = 0
    while queues:
        sent, received, used = [0] * len(names), [0] * len(names), [0] * len(names)
        alive = [p for _, p in sorted([(-max(left[p[0]], left[p[1]]), p) for p in queues])]
        while alive:  # a pair whose next message does not fit stays out for the round: loads only grow
            still = []
            for pair in alive:
                q = queues[pair]
                src, dst = pair  # never equal: network messages only
                nbytes, mid = q[-1]
                out, into = used[src] + nbytes, used[dst] + nbytes
                if out > budget or into > budget or sent[src] + nbytes > half or received[dst] + nbytes > half:
                    continue
                sent[src] += nbytes
                received[dst] += nbytes
                used[src], used[dst] = out, into
                left[src] -= nbytes
                left[dst] -= nbytes
                rounds[mid] = r
                q.pop()
                if q:
                    still.append(pair)
                else:
                    del queues[pair]
            alive = still
        r += 1
    return rounds
