"""Graphviz DOT of a plan: one cluster per host holding one node per device and the host's
agent, the bytes copied between devices, and the coalesced messages between agents by round.

Two kinds of edges, each styled network vs local:
- device -> device, labelled with the bytes copied along it: red and bold over the network,
  grey and dashed inside a host. Copies that stay on one device are not drawn as self-loops but
  counted in the device's label ("in place").
- agent -> agent, one per (src host, dst host, round) with messages, labelled
  `round R: N messages, BYTES`: blue and bold over the network, grey and dashed (a self-loop)
  inside a host; the pen width grows with the bytes.
A legend node and a comment at the top say the same. Output is deterministic: hosts in topology
order, devices by id, device edges sorted by (src, dst), message edges by (round, hosts).
"""

from __future__ import annotations

import json

from tenplex.compiler.emit.flows import Traffic, device_flows, host_order, round_traffic, topology_of
from tenplex.compiler.emit.fmt import human_bytes, plural
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import LinkClass, Topology

_EDGE_STYLE = {
    LinkClass.NETWORK: 'style=bold, color="#c0392b", penwidth=2',
    LinkClass.HOST: 'style=dashed, color="#555555"',
}
_MESSAGE_STYLE = {  # by Traffic.network
    True: 'style=bold, color="#2471a3", fontcolor="#2471a3"',
    False: 'style=dashed, color="#7f8c8d", fontcolor="#7f8c8d"',
}
_MAX_NAMES = 3
_LEGEND = (
    "legend\\l"
    "device -> device: bytes copied (red bold: over the network; grey dashed: inside a host)\\l"
    "agent -> agent: coalesced messages, one edge per round (blue bold: over the network;\\l"
    "  grey dashed loop: inside a host); wider = more bytes\\l"
)


def quote(text: str) -> str:
    """A DOT double-quoted string (JSON escaping is valid DOT; `\\n` is a line break)."""
    return json.dumps(text, ensure_ascii=False)


def _names(label: str, pids: tuple[str, ...]) -> str:
    shown = ", ".join(pids[:_MAX_NAMES]) + (f", +{len(pids) - _MAX_NAMES}" if len(pids) > _MAX_NAMES else "")
    return f"\n{label}: {shown}" if pids else ""


def _node(device: int, src: PTC, plan: Plan, in_place: int) -> str:
    label = f"device {device}"
    label += _names("src", src.allocation.by_device.get(device, ()))
    label += _names("dst", plan.allocation.by_device.get(device, ()))
    if in_place:
        label += f"\nin place: {human_bytes(in_place)}"
    return f"    {quote(f'd{device}')} [label={quote(label)}];"


def _agent(host: str) -> str:
    return quote(f"agent {host}")


def _clusters(
    topology: Topology, src: PTC, plan: Plan, flows: dict[tuple[int, int], int], hosts: list[str]
) -> list[str]:
    lines = []
    for host in hosts:
        lines.append(f"  subgraph {quote(f'cluster_{host}')} {{")
        lines.append(f"    label={quote(host)};")
        lines.append(
            f'    {_agent(host)} [label={quote(f"agent {host}")}, shape=oval, style=filled, fillcolor="#eaf2f8"];'
        )
        for d in topology.devices_on(host) if host in topology.hosts else ():
            lines.append(_node(d, src, plan, flows.get((d, d), 0)))
        lines.append("  }")
    return lines


def _edges(topology: Topology, flows: dict[tuple[int, int], int]) -> list[str]:
    lines = []
    for (s, d), nbytes in flows.items():
        if s == d:
            continue
        style = _EDGE_STYLE[topology.link(s, d)]
        lines.append(f"  {quote(f'd{s}')} -> {quote(f'd{d}')} [label={quote(human_bytes(nbytes))}, {style}];")
    return lines


def _message_edges(traffic: list[Traffic]) -> list[str]:
    biggest = max((t.bytes for t in traffic), default=0) or 1
    lines = []
    for t in traffic:
        label = f"round {t.rounds[0]}: {plural(t.messages, 'message')}, {human_bytes(t.bytes)}"
        width = 1 + 3 * t.bytes / biggest
        lines.append(f"  {_agent(t.src_host)} -> {_agent(t.dst_host)} "
                     f"[label={quote(label)}, {_MESSAGE_STYLE[t.network]}, penwidth={width:.1f}];")  # fmt: skip
    return lines


def to_dot(plan: Plan, src: PTC, dst: PTC) -> str:
    """The plan as a Graphviz digraph (render with `dot -Tsvg`)."""
    topology = topology_of(src, dst)
    flows = device_flows(plan, dst)
    order = host_order(topology, plan)
    stats = plan.stats
    title = (f"tenplex plan: {plural(len(plan.ops), 'op')}, {plural(len(plan.messages), 'message')}, {plural(stats.rounds, 'round')}; "
             f"network {human_bytes(stats.network_bytes)} (lower bound {human_bytes(stats.network_lower_bound_bytes)})")  # fmt: skip
    head = [
        "digraph plan {",
        "  // clusters are hosts; d<N> nodes are devices, 'agent <host>' nodes their host's agent.",
        "  // device -> device edges: bytes copied (bold red: network, dashed grey: same host).",
        "  // agent -> agent edges: coalesced messages per round (bold blue: network, dashed grey: same host).",
        f"  graph [label={quote(title)}, labelloc=t, rankdir=LR, fontname=Helvetica];",
        "  node [shape=box, style=rounded, fontname=Helvetica];",
        "  edge [fontname=Helvetica];",
        f'  legend [shape=note, style=filled, fillcolor="#fdfefe", fontsize=10, label="{_LEGEND}"];',
    ]
    body = _clusters(topology, src, plan, flows, list(order)) + _edges(topology, flows)
    return "\n".join(head + body + _message_edges(round_traffic(plan, order)) + ["}"]) + "\n"
