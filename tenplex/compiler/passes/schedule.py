"""`schedule`: put messages in rounds.

Network messages are placed round by round so that no host's message buffers (bytes it sends
plus bytes it receives in a round) exceed `memory_budget_bytes`. In each round, host pairs whose
busiest end has the most bytes left (the hosts that bound the plan's time) take one message each
in turn while both ends have room, which spreads NIC load over all hosts. Local messages run in
round 0; a forward message runs in the round after the message that delivered its data.
"""

from __future__ import annotations

import attrs
import numpy as np

from tenplex.compiler.program import Program
from tenplex.compiler.table import I64


@attrs.frozen
class Schedule:
    name = "schedule"
    requires = frozenset({"messages"})
    provides = frozenset({"scheduled"})

    def apply(self, program: Program) -> Program:
        m, n = program.messages, program.table.n
        network = np.flatnonzero(m.src != m.dst)
        rounds = np.full(len(m), -1, I64)
        rounds[network] = _network_rounds(m.hosts, m.src[network], m.dst[network], m.bytes[network],
                                          program.options.memory_budget_bytes)  # fmt: skip
        # a forward runs the round after the network message that landed its data; others in round 0
        message_of = np.full(n, -1, I64)
        message_of[m.ops] = np.repeat(np.arange(len(m)), m.lens)
        landing = np.full(n, -1, I64)
        landing[program.edges[:, 1]] = program.edges[:, 0]
        pred = landing[m.ops]
        after = np.where(pred >= 0, rounds[message_of[pred]] + 1, 0)
        local = np.flatnonzero(m.src == m.dst)
        if len(m.ops):
            rounds[local] = np.maximum.reduceat(after, m.offsets[:-1])[local]
        return attrs.evolve(program, messages=attrs.evolve(m, round=rounds))


def _network_rounds(hosts, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, budget: int) -> np.ndarray:
    """The round of each network message (hosts `hosts[src]` -> `hosts[dst]`, message ids in
    the given order). Rounds are filled one at a time: host pairs whose busiest end has the
    most bytes left go first, taking one message each (largest first, then by id) in turn while
    both ends' buffers have room. Each direction of a host gets half the budget (NICs are full
    duplex, so a round is fastest when a host sends and receives equally), and both together
    never exceed it.

    Host pairs grow with hosts times DP replicas and every round orders all of them, so they
    are numbered in (src name, dst name) order (a number order is the name order) and ordered
    by numpy; hosts are counted in lists."""
    out = np.full(len(nbytes), -1, I64)
    if not len(nbytes):
        return out
    half = max(budget // 2, int(nbytes.max()))
    rank = np.empty(len(hosts), I64)
    rank[np.argsort(np.array(hosts, dtype=object), kind="stable")] = np.arange(len(hosts))
    a, b = rank[src], rank[dst]
    order = np.lexsort((np.arange(len(nbytes)), -nbytes, b, a))  # per pair: largest first, then by id
    key = a[order] * len(hosts) + b[order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    ends = np.append(starts[1:], len(order))
    sizes, ids = nbytes[order].tolist(), order.tolist()
    queues = [list(zip(sizes[i:j], ids[i:j]))[::-1] for i, j in zip(starts.tolist(), ends.tolist())]  # pop() takes the largest
    pairs = list(zip(a[order][starts].tolist(), b[order][starts].tolist()))
    left = np.zeros(len(hosts), I64)
    np.add.at(left, a, nbytes)
    np.add.at(left, b, nbytes)
    _fill(queues, pairs, left.tolist(), budget, half, out)
    return out


def _fill(queues: list[list[tuple[int, int]]], pairs: list[tuple[int, int]], left: list[int], budget: int, half: int,
          out: np.ndarray) -> None:  # fmt: skip
    """Set `out[id]` to the round of each queued (bytes, id), round by round (see `_network_rounds`)."""
    names = len(left)
    ends = np.array(pairs, np.int64).reshape(-1, 2)
    rounds: dict[int, int] = {}
    live = np.arange(len(pairs))
    r = 0
    while len(live):
        alive = _by_priority(live, ends, left)
        sent, received, used = [0] * names, [0] * names, [0] * names
        while alive:  # a pair whose next message does not fit stays out for the round: loads only grow
            still = []
            for i in alive:
                q = queues[i]
                src, dst = pairs[i]  # never equal: network messages only
                nbytes, mid = q[-1]
                into, outgoing = used[dst] + nbytes, used[src] + nbytes
                if outgoing > budget or into > budget or sent[src] + nbytes > half or received[dst] + nbytes > half:
                    continue
                sent[src] += nbytes
                received[dst] += nbytes
                used[src], used[dst] = outgoing, into
                left[src] -= nbytes
                left[dst] -= nbytes
                rounds[mid] = r
                q.pop()
                if q:
                    still.append(i)
            alive = still
        live = live[[bool(queues[i]) for i in live.tolist()]]
        r += 1
    out[np.array(list(rounds), I64)] = np.array(list(rounds.values()), I64)


def _by_priority(live: np.ndarray, ends: np.ndarray, left: list[int]) -> list[int]:
    """Pair numbers of `live`, the pair whose busiest end has the most bytes left first (ties:
    in pair order)."""
    counts = np.array(left, np.int64)  # counted in int64 by `_network_rounds`, and only ever lower
    busiest = np.maximum(counts[ends[live, 0]], counts[ends[live, 1]])
    return live[np.lexsort((live, -busiest))].tolist()
