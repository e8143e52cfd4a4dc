"""What the picture shows, computed without matplotlib: hosts with their devices (or a count of
them when there are too many to draw one by one), the coalesced messages between hosts summed
per host pair, and one row per host pair of messages by round.

Invariants: hosts are in topology order (then any host only a message names); `pairs` and
`rows` are in host order; a row's cells are by round; at most MAX_ROWS rows, the pairs beyond
them summed into one row for the network and one for same-host messages.
"""

from __future__ import annotations

import attrs

from tenplex.compiler.emit.flows import Traffic, host_order, op_counts, pair_traffic, round_traffic, topology_of
from tenplex.compiler.emit.fmt import human_bytes, human_seconds, plural, ratio
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC

MAX_DEVICES = 32  # more devices in all, or more than MAX_DEVICES_PER_HOST on a host: one box per host
MAX_DEVICES_PER_HOST = 8
MAX_ROWS = 24


@attrs.frozen
class DeviceView:
    id: int
    role: str  # "both" (holds src and dst state), "src" (src only), "dst" (dst only), "idle"
    label: str  # the first dst partition under the plan's allocation, else the first src one


@attrs.frozen
class HostView:
    name: str
    devices: tuple[DeviceView, ...]
    local: Traffic | None  # messages that stay on this host


@attrs.frozen
class Row:
    label: str
    network: bool
    total: Traffic
    cells: tuple[Traffic, ...]  # one per round with messages, by round
    merged: bool = False  # the sum of several pairs


@attrs.frozen
class Scene:
    title: str
    summary: tuple[str, ...]
    hosts: tuple[HostView, ...]
    per_device: bool
    pairs: tuple[Traffic, ...]  # between two hosts, in host order
    rows: tuple[Row, ...]
    rounds: int


def _role(in_src: bool, in_dst: bool) -> str:
    return {(True, True): "both", (True, False): "src", (False, True): "dst"}.get((in_src, in_dst), "idle")


def _device(d: int, src: PTC, plan: Plan) -> DeviceView:
    src_pids, dst_pids = src.allocation.by_device.get(d, ()), plan.allocation.by_device.get(d, ())
    names = dst_pids or src_pids
    label = names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "") if names else ""
    return DeviceView(d, _role(bool(src_pids), bool(dst_pids)), label)


def _rows(traffic: list[Traffic], pairs: list[Traffic]) -> tuple[Row, ...]:
    by_pair: dict[tuple[str, str], list[Traffic]] = {}
    for t in traffic:
        by_pair.setdefault((t.src_host, t.dst_host), []).append(t)
    kept = set(range(len(pairs)))
    if len(pairs) > MAX_ROWS:  # keep the biggest pairs (ties: host order), sum the rest per link kind
        kept = set(sorted(kept, key=lambda i: (-pairs[i].bytes, i))[: MAX_ROWS - 2])
    rows = [
        Row(_pair_label(p), p.network, p, tuple(by_pair[(p.src_host, p.dst_host)]))
        for i, p in enumerate(pairs)
        if i in kept
    ]
    for network in (True, False):
        rest = [p for i, p in enumerate(pairs) if i not in kept and p.network == network]
        if rest:
            rows.append(_merged(rest, [c for p in rest for c in by_pair[(p.src_host, p.dst_host)]], network))
    return tuple(rows)


def _merged(rest: list[Traffic], cells: list[Traffic], network: bool) -> Row:
    """One row for several pairs: their messages summed per round (its hosts are "*": the row's
    `network` styles it)."""
    per_round: dict[int, list[int]] = {}
    for c in cells:
        acc = per_round.setdefault(c.rounds[0], [0, 0])
        acc[0] += c.messages
        acc[1] += c.bytes
    merged = tuple(Traffic("*", "*", (r,), *per_round[r]) for r in sorted(per_round))
    total = Traffic("*", "*", tuple(sorted(per_round)), sum(p.messages for p in rest), sum(p.bytes for p in rest))
    label = f"+{len(rest)} {'network' if network else 'same-host'} pairs"
    return Row(label, network, total, merged, merged=True)


def _pair_label(p: Traffic) -> str:
    return f"{p.src_host} → {p.dst_host}" if p.network else f"{p.src_host} (same host)"


def _summary(plan: Plan) -> tuple[str, ...]:
    s, kinds = plan.stats, op_counts(plan)
    network = sum(m.src_host != m.dst_host for m in plan.messages)
    return (
        f"{plural(len(plan.ops), 'op')}: {plural(kinds['copy'], 'copy', 'copies')}, {plural(kinds['fill'], 'fill')}, "
        f"{plural(kinds['value'], 'value')}",
        f"{plural(len(plan.messages), 'message')} in {plural(s.rounds, 'round')}",
        f"    {network} between hosts, {len(plan.messages) - network} within a host",
        f"network: {human_bytes(s.network_bytes)} (lower bound {human_bytes(s.network_lower_bound_bytes)}, "
        f"{ratio(s.network_bytes, s.network_lower_bound_bytes)})",
        f"same host: {human_bytes(s.host_bytes)}; same device: {human_bytes(s.device_bytes)}",
        f"predicted: {human_seconds(s.predicted_seconds)} (lower bound {human_seconds(s.lower_bound_seconds)})",
    )


def scene(plan: Plan, src: PTC, dst: PTC) -> Scene:
    """Everything the picture draws, in drawing order."""
    topology = topology_of(src, dst)
    order = host_order(topology, plan)
    traffic = round_traffic(plan, order)
    pairs = pair_traffic(traffic, order)
    local = {p.src_host: p for p in pairs if not p.network}
    on_host = {h: topology.devices_on(h) if h in topology.hosts else () for h in order}
    hosts = tuple(HostView(h, tuple(_device(d, src, plan) for d in on_host[h]), local.get(h)) for h in order)
    most = max(map(len, on_host.values()), default=0)
    per_device = len(topology.devices) <= MAX_DEVICES and most <= MAX_DEVICES_PER_HOST
    title = f"tenplex plan: {plural(len(topology.devices), 'device')} on {plural(len(topology.hosts), 'host')}"
    rounds = max(plan.stats.rounds, max((m.round + 1 for m in plan.messages), default=0))
    network = tuple(p for p in pairs if p.network)
    return Scene(title, _summary(plan), hosts, per_device, network, _rows(traffic, pairs), rounds)
