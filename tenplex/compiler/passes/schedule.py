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

from tenplex.compiler import keysort
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
    size_rank = keysort.unique_first(-nbytes)[2]  # sizes by rank, largest first: the keys pack into one sort
    order = keysort.lexsort((size_rank, b, a))  # per pair: largest first, then by id (the sort is stable)
    key = a[order] * len(hosts) + b[order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    ends = np.stack((a[order], b[order]), axis=1)  # each message's hosts, in queue order
    out[order] = _fill(nbytes[order], starts.tolist(), ends, budget, half, len(hosts))
    return out


def _fill(nbytes: np.ndarray, starts: list[int], ends: np.ndarray, budget: int, half: int, names: int) -> np.ndarray:
    """The round of each message (`nbytes` and host `ends` in queue order: pair i's queue starts
    at `starts[i]`, largest first, and runs to the next pair's), round by round (see
    `_network_rounds`); `left` is lowered once per round by what each host sent and received."""
    sizes = nbytes.tolist()
    pairs = ends[starts]
    queues = _Queues(sizes, starts, pairs[:, 0].tolist(), pairs[:, 1].tolist())
    left = np.zeros(names, I64)  # bytes each host has left to send and receive
    per_pair = np.add.reduceat(nbytes, starts) if starts else np.zeros(0, I64)  # a queue's messages have one pair of hosts
    np.add.at(left, pairs, per_pair[:, None])  # per pair, not per message (~0.013 CPU s at 1024 GPUs)
    rounds = np.full(len(sizes), -1, I64)
    live, more = np.arange(len(starts)), np.ones(len(starts), bool)
    r = 0
    while len(live):
        alive = _by_priority(live, pairs, left)
        if 2 * half <= budget:  # the budget never binds: `_Queues.round_halves`
            placed, gone, used = queues.round_halves(alive, half, names)
        else:
            placed, gone, used = queues.round(alive, budget, half, names)
        rounds[np.array(placed, I64)] = r
        left -= np.array(used, I64)
        more[gone] = False
        live = live[more[live]]
        r += 1
    return rounds


class _Queues:
    """Each host pair's messages (`sizes` in queue order; pair i's from `starts[i]` to the next
    pair's start), the next one at `pos[i]` with its size in `head[i]`."""

    def __init__(self, sizes: list[int], starts: list[int], src: list[int], dst: list[int]):
        self.sizes, self.src, self.dst = sizes, src, dst
        self.pos, self.head, self.stops = list(starts), [sizes[i] for i in starts], starts[1:] + [len(sizes)]

    def round(self, alive: list[int], budget: int, half: int, names: int) -> tuple[list[int], list[int], list[int]]:
        """Fill one round from the pairs `alive` in priority order: (the messages placed, the
        pairs emptied, the bytes each host sent and received). A visit that does not fit is most of the work (2.3M of 2.9M at 4096
        GPUs), so it is two list reads and two comparisons against each host's room to send
        and to receive (the least of what the budget and its half leave), kept up to date as
        messages are placed."""
        sizes, src, dst, pos, head, stops = self.sizes, self.src, self.dst, self.pos, self.head, self.stops
        sent, received, used = [0] * names, [0] * names, [0] * names
        send_room, receive_room = [min(budget, half)] * names, [min(budget, half)] * names
        placed: list[int] = []
        gone: list[int] = []
        while alive:  # a pair whose next message does not fit stays out for the round: loads only grow
            still = []
            for i in alive:
                size = head[i]
                s = src[i]
                if size > send_room[s]:
                    continue
                d = dst[i]  # never equal to s: network messages only
                if size > receive_room[d]:
                    continue
                k = pos[i]
                placed.append(k)
                pos[i] = k = k + 1
                if k < stops[i]:
                    head[i] = sizes[k]
                    still.append(i)
                else:
                    gone.append(i)
                # each room is the least of what the budget and the direction's half leave
                used[s] = u = used[s] + size
                sent[s] = x = sent[s] + size
                room, a, b = budget - u, half - x, half - received[s]  # min() calls cost more than the compares
                send_room[s] = a if a < room else room
                receive_room[s] = b if b < room else room
                used[d] = u = used[d] + size
                received[d] = x = received[d] + size
                room, a, b = budget - u, half - sent[d], half - x
                send_room[d] = a if a < room else room
                receive_room[d] = b if b < room else room
            alive = still
        return placed, gone, used

    def round_halves(self, alive: list[int], half: int, names: int) -> tuple[list[int], list[int], list[int]]:
        """`round` where two halves fit in the budget (`2 * half <= budget`: the default
        options, every network message at most half the budget). Then the budget never binds:
        a host's sends and receives each stay within `half`, so together within the budget,
        and `budget - used` is never below `half - sent` (nor `half - received`). Each room
        is the half less what that direction has taken: a placed message lowers two counts
        where `round` updates ten."""
        sizes, src, dst, pos, head, stops = self.sizes, self.src, self.dst, self.pos, self.head, self.stops
        send_room, receive_room = [half] * names, [half] * names
        placed: list[int] = []
        gone: list[int] = []
        while alive:
            still = []
            for i in alive:
                size = head[i]
                s = src[i]
                if size > send_room[s]:
                    continue
                d = dst[i]
                if size > receive_room[d]:
                    continue
                send_room[s] -= size
                receive_room[d] -= size
                k = pos[i]
                placed.append(k)
                pos[i] = k = k + 1
                if k < stops[i]:
                    head[i] = sizes[k]
                    still.append(i)
                else:
                    gone.append(i)
            alive = still
        return placed, gone, [2 * half - a - b for a, b in zip(send_room, receive_room)]


def _by_priority(live: np.ndarray, ends: np.ndarray, left: np.ndarray | list[int]) -> list[int]:
    """Pair numbers of `live` (ascending), the pair whose busiest end has the most bytes left
    first (ties: in pair order, by a stable sort)."""
    counts = np.array(left, np.int64)  # counted in int64 by `_network_rounds`, and only ever lower
    busiest = np.maximum(counts[ends[live, 0]], counts[ends[live, 1]])
    return live[keysort.argsort(-busiest)].tolist()
