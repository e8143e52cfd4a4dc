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
import numpy as np

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
        preds: dict[int, list[int]] = defaultdict(list)
        for a, b, _ in program.graph.edges():
            preds[b].append(a)
        for m in messages:
            if m.id not in rounds:
                deps = {message_of[p] for op in m.ops for p in preds.get(op, ())}
                rounds[m.id] = max((rounds[d] + 1 for d in deps), default=0)
        placed = tuple(m if m.round == rounds[m.id] else trusted_message(m.id, m.src_host, m.dst_host, m.ops, m.bytes, rounds[m.id])
                       for m in messages)  # fmt: skip
        return attrs.evolve(program, messages=placed)


def _network_rounds(network: list, budget: int) -> dict[int, int]:
    """Fill rounds one at a time: host pairs whose busiest end has the most bytes left go
    first, taking one message each in turn while both ends' buffers have room. Each direction
    of a host gets half the budget (NICs are full duplex, so a round is fastest when a host
    sends and receives equally), and both together never exceed it.

    Host pairs grow with hosts times DP replicas and every round orders all of them, so they
    are numbered in (src name, dst name) order (a number order is the name order) and ordered
    by numpy; hosts are counted in lists."""
    half = max([budget // 2] + [m.bytes for m in network])
    names = sorted({h for m in network for h in (m.src_host, m.dst_host)})
    ix = {h: i for i, h in enumerate(names)}
    by_pair: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (bytes, message id)
    left = [0] * len(names)
    for m in sorted(network, key=lambda m: (-m.bytes, m.id)):
        src, dst = ix[m.src_host], ix[m.dst_host]
        by_pair[(src, dst)].append((m.bytes, m.id))
        left[src] += m.bytes
        left[dst] += m.bytes
    pairs = sorted(by_pair)
    queues = [by_pair[p][::-1] for p in pairs]  # pop() takes the largest
    ends = np.array(pairs, np.int64).reshape(-1, 2)
    rounds: dict[int, int] = {}
    live = np.arange(len(pairs))
    r = 0
    while len(live):
        alive = _by_priority(live, ends, left)
        sent, received, used = [0] * len(names), [0] * len(names), [0] * len(names)
        while alive:  # a pair whose next message does not fit stays out for the round: loads only grow
            still = []
            for i in alive:
                q = queues[i]
                src, dst = pairs[i]  # never equal: network messages only
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
                    still.append(i)
            alive = still
        live = live[[bool(queues[i]) for i in live.tolist()]]
        r += 1
    return rounds


def _by_priority(live: np.ndarray, ends: np.ndarray, left: list[int]) -> list[int]:
    """Pair numbers of `live`, the pair whose busiest end has the most bytes left first (ties:
    in pair order)."""
    try:
        counts = np.array(left, np.int64)
    except OverflowError:  # past 8 EiB: the same order, by Python ints
        return sorted(live.tolist(), key=lambda i: (-max(left[ends[i, 0]], left[ends[i, 1]]), i))
    busiest = np.maximum(counts[ends[live, 0]], counts[ends[live, 1]])
    return live[np.lexsort((live, -busiest))].tolist()
