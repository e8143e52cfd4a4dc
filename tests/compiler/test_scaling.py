"""The compiler's fast paths against their slow, obvious definitions (each an oracle written
here): the round filler of `schedule`, the least-loaded host choice of `select-sources`, and
the per-host network lower bound, whose fast version computes hosts alike only once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.compiler.cost import host_lower_bounds
from tenplex.compiler.passes.choice.hosts import least_sent_hosts
from tenplex.compiler.passes.schedule import _network_rounds
from tenplex.compiler.plan import Message
from tests.problems import problems

HOSTS = [f"h{i}" for i in range(5)]


class LeastSent:
    """Bytes sent per host, and the host of a holder set that has sent the fewest (first in
    `rank` order on ties), from one heap per set: O(log n) a choice instead of a scan of all
    holder hosts (which grow with DP). Counts only grow, so a heap entry whose count is stale
    is too small: it surfaces first and is pushed back with its count."""

    def __init__(self, rank: dict[str, int]):
        self.rank = rank
        self.sent: Counter[str] = Counter()
        self.heaps: dict[int, tuple[object, list[tuple[int, int, str]]]] = {}  # id(set) -> (set, heap)
        self.shared: dict[tuple[str, ...], list[tuple[int, int, str]]] = {}  # equal sets share a heap

    def add(self, host: str, nbytes: int) -> None:
        self.sent[host] += nbytes

    def least(self, hosts: Iterable[str]) -> str:
        """`hosts` must not change while it is used here (the heap is kept by its id)."""
        entry = self.heaps.get(id(hosts))
        if entry is None:
            key = tuple(sorted(hosts))
            if key not in self.shared:  # one heap per distinct set: a count goes stale in few heaps
                self.shared[key] = [(self.sent[h], self.rank[h], h) for h in key]
                heapq.heapify(self.shared[key])
            entry = self.heaps[id(hosts)] = (hosts, self.shared[key])  # keeps `hosts` alive for id()
        heap, sent = entry[1], self.sent
        while heap[0][0] != sent[heap[0][2]]:
            _, rank, h = heap[0]
            heapq.heapreplace(heap, (sent[h], rank, h))
        return heap[0][2]


def _fits(nbytes: int, pair: tuple[str, str], used, sent, received, budget: int, half: int) -> bool:
    src, dst = pair
    return (sent[src] + nbytes <= half and received[dst] + nbytes <= half
            and used[src] + nbytes <= budget and used[dst] + nbytes <= budget)  # fmt: skip


def rescanning_rounds(network: list[Message], budget: int) -> dict[int, int]:
    """The round filler as first written: every pass over a round rescans every host pair."""
    half = max([budget // 2] + [m.bytes for m in network])
    queues: dict[tuple[str, str], list[Message]] = defaultdict(list)
    left: dict[str, int] = defaultdict(int)
    for m in sorted(network, key=lambda m: (-m.bytes, m.id)):
        queues[(m.src_host, m.dst_host)].append(m)
        left[m.src_host] += m.bytes
        left[m.dst_host] += m.bytes
    for q in queues.values():
        q.reverse()
    rounds, r = {}, 0
    while queues:
        used, sent, received = defaultdict(int), defaultdict(int), defaultdict(int)
        order = sorted(queues, key=lambda p: (-max(left[p[0]], left[p[1]]), p))
        placed = True
        while placed:
            placed = False
            for pair in order:
                q = queues.get(pair)
                if q and _fits(q[-1].bytes, pair, used, sent, received, budget, half):
                    m = q.pop()
                    sent[pair[0]] += m.bytes
                    received[pair[1]] += m.bytes
                    for h in pair:
                        used[h] += m.bytes
                        left[h] -= m.bytes
                    rounds[m.id] = r
                    placed = True
        queues = {p: q for p, q in queues.items() if q}
        r += 1
    return rounds


@st.composite
def network_messages(draw) -> list[Message]:
    pairs = st.tuples(st.sampled_from(HOSTS), st.sampled_from(HOSTS)).filter(lambda p: p[0] != p[1])
    drawn = draw(st.lists(st.tuples(pairs, st.integers(1, 40)), max_size=60))
    return [Message(i, a, b, (i,), nbytes) for i, ((a, b), nbytes) in enumerate(drawn)]


@settings(deadline=None, max_examples=200)
@given(network_messages(), st.integers(40, 120))
def test_schedule_places_every_message_in_the_round_the_rescanning_filler_does(network, budget):
    """The budget holds the largest message (as `CompileOptions` requires), so all get placed.
    The filler takes messages as columns: host numbers into a host list not in name order."""
    hosts = HOSTS[::-1]
    src = np.array([hosts.index(m.src_host) for m in network], np.int64)
    dst = np.array([hosts.index(m.dst_host) for m in network], np.int64)
    nbytes = np.array([m.bytes for m in network], np.int64)
    rounds = _network_rounds(tuple(hosts), src, dst, nbytes, budget)
    assert dict(enumerate(rounds.tolist())) == rescanning_rounds(network, budget)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.lists(st.sampled_from(HOSTS), min_size=1, unique=True), st.integers(0, 50)), max_size=40))
def test_least_sent_host_is_the_minimum_over_the_set(choices):
    """Holder sets are reused (as `by_host` caches them); each choice sends some bytes."""
    rank = {h: i for i, h in enumerate(HOSTS)}
    sets = {tuple(hs): list(hs) for hs, _ in choices}  # one object per distinct list, equal sets apart
    least, sent = LeastSent(rank), defaultdict(int)
    for hs, nbytes in choices:
        hosts = sets[tuple(hs)]
        expected = min(hosts, key=lambda h: (sent[h], rank[h]))
        assert least.least(hosts) == expected
        least.add(expected, nbytes)
        sent[expected] += nbytes


@settings(deadline=None, max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 400), st.sampled_from([1, 2, 3, 50, 64, 1 << 40])), max_size=12),
       st.booleans())  # fmt: skip
def test_least_sent_hosts_by_runs_choose_what_the_heap_chooses(runs, overlap):
    """Runs of atoms (holder set, count, size) as select-sources orders them (any order of
    sizes works); sets 0-3 are DP-replica groups sharing no host, 4 and 5 overlap them."""
    groups = [HOSTS[:2], HOSTS[2:4], [HOSTS[4]], ["h5", "h6", "h7"], HOSTS[1:3], ["h7", "h8"]]
    rank = {h: i for i, h in enumerate(sorted({h for g in groups for h in g}, reverse=True))}
    sets = [{h: [] for h in g} for g in groups]
    atoms = [(sets[g if overlap else g % 4], nbytes) for g, k, nbytes in runs for _ in range(k)]
    least = LeastSent(rank)
    expected = []
    for hosts, nbytes in atoms:
        expected.append(least.least(hosts))
        least.add(expected[-1], nbytes)
    nbytes = np.array([n for _, n in atoms], np.int64)
    which = np.array([g if overlap else g % 4 for g, k, _ in runs for _ in range(k)], np.int64)
    names = sorted(rank, key=rank.__getitem__)
    members = [sorted(rank[h] for h in hosts) for hosts in sets]
    assert [names[r] for r in least_sent_hosts(which, members, nbytes, len(rank)).tolist()] == expected


def _points(box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(a, b) for a, b in zip(box.start, box.stop))))


def pointwise_lower_bounds(src, dst) -> dict[str, int]:
    """Per dst host: bytes of the elements its dst sub-tensors hold that no src device on the
    host holds, counted point by point."""
    host = {d.id: d.host for d in src.topology.union(dst.topology).devices}

    def held(ptc) -> dict[str, set]:
        out: dict[str, set] = defaultdict(set)
        for st_ in ptc.subtensors:
            points = {(st_.tensor, x) for p in st_.pieces for x in _points(p.global_box)}
            for d in ptc.devices_of_subtensor(st_.id):
                out[host[d]] |= points
        return out

    have, need = held(src), held(dst)
    hosts = {host[d] for pid, devs in dst.allocation.items if dst.partition_map[pid].subtensors for d in devs}
    return {h: sum(dst.itemsize(t) for t, _ in need[h] - have[h]) for h in sorted(hosts)}


@settings(deadline=None, max_examples=150)
@given(problems())
def test_host_lower_bounds_count_every_missing_element_once(problem):
    src, dst = problem
    assert host_lower_bounds(src, dst) == pointwise_lower_bounds(src, dst)


def test_pairs_are_ordered_by_their_busiest_end_then_pair_order():
    from tenplex.compiler.passes.schedule import _by_priority

    ends = np.array([(0, 1), (0, 2), (1, 2), (2, 0)], np.int64)
    assert _by_priority(np.arange(4), ends, [3, 5, 3]) == [0, 2, 1, 3]  # busiest ends 5, 3, 5, 3 (ties: pair order)
