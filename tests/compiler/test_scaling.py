"""The compiler's fast paths against their slow, obvious definitions (each an oracle written
here): the round filler of `schedule`, the least-loaded host choice of `select-sources`, and
the per-host network lower bound, whose fast version computes hosts alike only once.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.compiler.cost import host_lower_bounds
from tenplex.compiler.passes.schedule import _network_rounds
from tenplex.compiler.passes.select_sources import LeastSent
from tenplex.compiler.plan import Message
from tests.problems import problems

HOSTS = [f"h{i}" for i in range(5)]


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
    """The budget holds the largest message (as `CompileOptions` requires), so all get placed."""
    assert _network_rounds(network, budget) == rescanning_rounds(network, budget)


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


def test_pairs_are_ordered_alike_past_int64():
    """The round filler orders pairs by numpy, and by Python ints when byte counts pass int64."""
    import numpy as np

    from tenplex.compiler.passes.schedule import _by_priority

    ends = np.array([(0, 1), (0, 2), (1, 2), (2, 0)], np.int64)
    live = np.arange(4)
    for scale in (1, 1 << 70):
        left = [3 * scale, 5 * scale, 3 * scale]
        assert _by_priority(live, ends, left) == [0, 2, 1, 3]  # busiest ends 5, 3, 5, 3 (ties: pair order)
