"""The emitters' traffic tables (`flows`) and the DOT emitter's rounds and messages: one edge
per (src host, dst host, round) labelled with the round, messages and bytes, network and
same-host edges styled apart, a legend; the device edges and clusters stay as they were."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tenplex.compiler import compile_plan
from tenplex.compiler.emit import to_dot
from tenplex.compiler.emit.flows import Traffic, host_order, pair_traffic, round_ranges, round_traffic, topology_of
from tenplex.compiler.emit.fmt import human_bytes
from tenplex.frontends.spec import ptc_from_spec

SRC, DST = "gpt-tiny:tp2@1x2", "gpt-tiny:tp4@2x2"  # 2 rounds, messages within h0 and from h0 to h1


@pytest.fixture(scope="module")
def case():
    src, dst = ptc_from_spec(SRC), ptc_from_spec(DST)
    return compile_plan(src, dst), src, dst


@pytest.mark.parametrize(
    "rounds, text",
    [
        pytest.param((0,), "0", id="one"),
        pytest.param((0, 1, 2), "0-2", id="run"),
        pytest.param((0, 2, 3, 4, 7), "0, 2-4, 7", id="runs_and_singles"),
        pytest.param((), "", id="none"),
    ],
)
def test_round_ranges(rounds, text):
    assert round_ranges(rounds) == text


def test_round_traffic_sums_each_host_pair_in_each_round(case):
    plan, src, dst = case
    order = host_order(topology_of(src, dst), plan)
    traffic = round_traffic(plan, order)
    want: dict[tuple[int, str, str], list[int]] = {}
    for m in plan.messages:
        acc = want.setdefault((m.round, m.src_host, m.dst_host), [0, 0])
        acc[0] += 1
        acc[1] += m.bytes
    assert {(t.rounds[0], t.src_host, t.dst_host): [t.messages, t.bytes] for t in traffic} == want
    keys = [(t.rounds[0], order[t.src_host], order[t.dst_host]) for t in traffic]
    assert keys == sorted(keys)


def test_pair_traffic_sums_over_rounds(case):
    plan, src, dst = case
    order = host_order(topology_of(src, dst), plan)
    pairs = pair_traffic(round_traffic(plan, order), order)
    assert sum(p.bytes for p in pairs) == sum(m.bytes for m in plan.messages)
    assert sum(p.messages for p in pairs) == len(plan.messages)
    network = [p for p in pairs if p.network]
    assert sum(p.bytes for p in network) == sum(m.bytes for m in plan.messages if m.src_host != m.dst_host)
    assert Traffic("h0", "h0", (0,), 1, 8).network is False and Traffic("h0", "h1", (0,), 1, 8).network is True


def test_dot_has_one_edge_per_host_pair_and_round(case):
    plan, src, dst = case
    out = to_dot(plan, src, dst)
    order = host_order(topology_of(src, dst), plan)
    for t in round_traffic(plan, order):
        head = f'"agent {t.src_host}" -> "agent {t.dst_host}" '
        label = (
            f'[label="round {t.rounds[0]}: {t.messages} message{"s" if t.messages > 1 else ""}, {human_bytes(t.bytes)}"'
        )
        style = "style=bold" if t.network else "style=dashed"
        assert any(line.strip().startswith(head + label) and style in line for line in out.splitlines()), (head, label)
    assert len(re.findall(r'"agent [^"]+" -> "agent', out)) == len(round_traffic(plan, order))


def test_dot_keeps_its_clusters_devices_and_device_edges(case):
    plan, src, dst = case
    out = to_dot(plan, src, dst)
    assert out.startswith("digraph plan {") and out.rstrip().endswith("}")
    assert re.findall(r'subgraph "(cluster_[^"]+)"', out) == ["cluster_h0", "cluster_h1"]
    assert '"agent h0" [label="agent h0"' in out and '"agent h1" [label="agent h1"' in out
    assert re.search(r'"d1" -> "d\d" \[label="[^"]+", style=bold, color="#c0392b"', out)
    assert "legend [shape=note" in out and "// agent -> agent edges: coalesced messages per round" in out


def test_dot_is_deterministic(case):
    assert to_dot(*case) == to_dot(*case)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_graphviz_reads_the_dot(case):
    done = subprocess.run(["dot", "-Tsvg"], input=to_dot(*case), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "round 1:" in done.stdout
