"""The centralized baseline (the paper's Tenplex-Central): gather all state on one host, then scatter.

`compile_central(src, dst, host)` returns two verified plans: `gather` moves one copy of every src
partition onto `host` (each onto its own new device there, so the gathered state is a valid PTC,
`mid`), and `scatter` builds dst from `mid` alone. Every byte that changes hosts crosses the
network twice through one host's link, which is what peer-to-peer resharding avoids. Nothing
here is used by the peer-to-peer path; it exists to be measured against.

Invariants:
- `mid` holds exactly src's partitions, each on one device of `host`, none on src's devices;
- `scatter` reads only `mid` (its src PTC), so dst never depends on src devices directly.
"""

from __future__ import annotations

import attrs

from tenplex.compiler.compile import compile_plan
from tenplex.compiler.plan import CompileOptions, Plan
from tenplex.ir.errors import CompileError
from tenplex.ir.ptc import PTC, Allocation
from tenplex.ir.topology import Device, Topology


@attrs.frozen
class CentralPlan:
    host: str
    mid: PTC  # src gathered on `host` (allocation as placed by the gather plan)
    gather: Plan
    scatter: Plan

    @property
    def network_bytes(self) -> int:
        return self.gather.stats.network_bytes + self.scatter.stats.network_bytes


def gathered(src: PTC, dst: PTC, host: str) -> PTC:
    """src's partitions, one copy each, on new devices of `host` (ids after every device of both)."""
    topo = src.topology.union(dst.topology)
    if host not in topo.hosts:
        raise CompileError(f"central host {host!r} is not in the topology (hosts: {list(topo.hosts)})")
    base = max(d.id for d in topo.devices) + 1
    alloc = Allocation({p.id: (base + i,) for i, p in enumerate(src.partitions)})
    devices = topo.devices + tuple(Device(base + i, host) for i in range(len(src.partitions)))
    return PTC(src.tensors, src.subtensors, src.partitions, alloc, Topology(devices, topo.links))


def compile_central(src: PTC, dst: PTC, host: str, options: CompileOptions | None = None) -> CentralPlan:
    """Raises CompileError (as `compile_plan`, or for a host not in the topology)."""
    mid = gathered(src, dst, host)
    gather = compile_plan(src, mid, attrs.evolve(options or CompileOptions(), place_ranks=False))
    mid = mid.with_allocation(gather.allocation)
    return CentralPlan(host, mid, gather, compile_plan(mid, dst, options))
