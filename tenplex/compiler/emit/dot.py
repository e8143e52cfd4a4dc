"""Graphviz DOT of a plan: one cluster per host, one node per device, one edge per
(src device, dst device) pair labelled with the bytes copied along it.

Network edges are bold and red, edges inside a host dashed; copies that stay on one device are
not drawn as self-loops but counted in the device's label ("in place"). Output is
deterministic: hosts in topology order, devices by id, edges sorted by (src, dst).
"""

from __future__ import annotations

import json

from tenplex.compiler.emit.flows import device_flows, topology_of
from tenplex.compiler.emit.fmt import human_bytes, plural
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import LinkClass, Topology

_EDGE_STYLE = {
    LinkClass.NETWORK: 'style=bold, color="#c0392b", penwidth=2',
    LinkClass.HOST: 'style=dashed, color="#555555"',
}
_MAX_NAMES = 3


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


def _clusters(topology: Topology, src: PTC, plan: Plan, flows: dict[tuple[int, int], int]) -> list[str]:
    lines = []
    for host in topology.hosts:
        lines.append(f"  subgraph {quote(f'cluster_{host}')} {{")
        lines.append(f"    label={quote(host)};")
        for d in topology.devices_on(host):
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


def to_dot(plan: Plan, src: PTC, dst: PTC) -> str:
    """The plan as a Graphviz digraph (render with `dot -Tsvg`)."""
    topology = topology_of(src, dst)
    flows = device_flows(plan, dst)
    stats = plan.stats
    title = (f"tenplex plan: {plural(len(plan.ops), 'op')}, {plural(len(plan.messages), 'message')}, {plural(stats.rounds, 'round')}; "
             f"network {human_bytes(stats.network_bytes)} (lower bound {human_bytes(stats.network_lower_bound_bytes)})")  # fmt: skip
    head = [
        "digraph plan {",
        f"  graph [label={quote(title)}, labelloc=t, rankdir=LR, fontname=Helvetica];",
        "  node [shape=box, style=rounded, fontname=Helvetica];",
        "  edge [fontname=Helvetica];",
    ]
    return "\n".join(head + _clusters(topology, src, plan, flows) + _edges(topology, flows) + ["}"]) + "\n"
