"""A human summary of a plan: counts, bytes per link class, bytes and time against their lower
bounds, per-host network traffic, fills, and rank placement changes.

Plain text (no terminal markup), canonical and sorted, so it can go to files and goldens.
"""

from __future__ import annotations

from tenplex.compiler.cost import host_lower_bounds
from tenplex.compiler.emit.flows import device_flows, host_network_bytes, op_counts, topology_of
from tenplex.compiler.emit.fmt import human_bytes, human_seconds, plural, ratio, table
from tenplex.compiler.plan import FORMAT, Plan
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import LinkClass


def _sized(n: int) -> str:
    return f"{human_bytes(n)} ({n} B)" if n >= 1024 else human_bytes(n)


def _counts(plan: Plan) -> list[str]:
    kinds = op_counts(plan)
    network = sum(m.src_host != m.dst_host for m in plan.messages)
    return [
        f"ops:            {len(plan.ops)} ({plural(kinds['copy'], 'copy', 'copies')}, {plural(kinds['fill'], 'fill')}, "
        f"{plural(kinds['value'], 'value')})",
        f"messages:       {len(plan.messages)} ({network} between hosts, {len(plan.messages) - network} within a host)",
        f"rounds:         {plan.stats.rounds}",
    ]


def _bytes(plan: Plan) -> list[str]:
    s = plan.stats
    return [
        "bytes by link class:",
        table(
            ["class", "bytes", "exact"],
            [
                [LinkClass.DEVICE.value, human_bytes(s.device_bytes), s.device_bytes],
                [LinkClass.HOST.value, human_bytes(s.host_bytes), s.host_bytes],
                [LinkClass.NETWORK.value, human_bytes(s.network_bytes), s.network_bytes],
            ],
            align="lrr",
        ),  # fmt: skip
        f"network bytes:  {_sized(s.network_bytes)} vs lower bound {_sized(s.network_lower_bound_bytes)}: "
        f"{ratio(s.network_bytes, s.network_lower_bound_bytes)}",
        f"predicted time: {human_seconds(s.predicted_seconds)} vs bandwidth lower bound "
        f"{human_seconds(s.lower_bound_seconds)}: {ratio(s.predicted_seconds, s.lower_bound_seconds)}",
        f"fills:          {_sized(s.fill_bytes)} in {plural(op_counts(plan)['fill'], 'fill op')}",
    ]


def _hosts(plan: Plan, src: PTC, dst: PTC) -> list[str]:
    topology = topology_of(src, dst)
    traffic = host_network_bytes(device_flows(plan, dst), topology)
    bound = host_lower_bounds(src, dst, plan.allocation)
    rows = [[h, human_bytes(out), human_bytes(inn), human_bytes(bound.get(h, 0))] for h, (out, inn) in traffic.items()]
    return ["network bytes per host:", table(["host", "out", "in", "in lower bound"], rows, align="lrrr")]


def _placement(plan: Plan, dst: PTC) -> list[str]:
    moved = [(pid, devs, plan.allocation.devices_of(pid)) for pid, devs in dst.allocation.items
             if plan.allocation.mapping.get(pid) != devs]  # fmt: skip
    if not moved:
        return ["rank placement: as in dst (no partition moved)"]
    rows = [[pid, _devs(old), _devs(new)] for pid, old, new in moved]
    return [f"rank placement: {len(moved)} of {len(dst.partitions)} partitions placed differently from dst "
            "(launch each rank where the plan puts it):",
            table(["partition", "dst devices", "plan devices"], rows)]  # fmt: skip


def _devs(devs: tuple[int, ...]) -> str:
    return ",".join(map(str, devs))


def _options(plan: Plan) -> str:
    o = plan.options
    return (f"options:        place_ranks={str(o.place_ranks).lower()} max_message_bytes={human_bytes(o.max_message_bytes)} "
            f"memory_budget={human_bytes(o.memory_budget_bytes)} baseline={o.baseline or 'none'}")  # fmt: skip


def to_text(plan: Plan, src: PTC, dst: PTC) -> str:
    """The summary, ending with a newline."""
    topology = topology_of(src, dst)
    sections = [
        [
            f"tenplex plan ({FORMAT}): {plural(len(topology.devices), 'device')} on {plural(len(topology.hosts), 'host')}",
            _options(plan),
        ]
        + _counts(plan),
        _bytes(plan),
        _hosts(plan, src, dst),
        _placement(plan, dst),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"
