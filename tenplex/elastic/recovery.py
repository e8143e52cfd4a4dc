"""Failure recovery (docs/design.md §8): store replicas on the next n hosts, survivors, recovery plans.

A job keeps its state recoverable by holding, besides its training layout, `n` store replicas
of every partition: `with_replicas(ptc, n)` places, for every partition held on host h, one copy
on each of the next n hosts after h in sorted host order (wrapping), each on a new *virtual*
device of that host. The replicas are ordinary holders in the allocation, so the plan that
creates them is `compile_plan(ptc, with_replicas(ptc, n))` (`replication_plan`) and the state
plus replicas commit under one tag. When hosts die, `survivors(ptc, failed)` is that state
without the failed hosts' devices (virtual ones included), and `recovery_plan` compiles from
it to a new layout on the surviving hosts: nothing is read from a checkpoint on disk.

Invariants:
- `with_replicas(ptc, n)` keeps ptc's devices and holders; it adds, per partition, one virtual
  device per replica host, ids after every existing device, numbered in (partition id, host)
  order; a replica host never already holds the partition (DP replicas are not duplicated);
- 0 <= n < number of hosts (a replica on the holder's own host protects nothing);
- `survivors` keeps exactly the devices not on a failed host; every partition keeps >= 1 holder,
  else `RecoveryError` names each lost partition and the hosts it was on;
- `recovery_plan`'s dst uses only surviving hosts.

With n store replicas on the next n hosts, a partition is lost only when all of its holders'
hosts and their next n hosts failed: for one holder, more than n consecutive hosts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from tenplex.compiler import CompileOptions, Plan, compile_plan
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC, Allocation
from tenplex.ir.topology import Device, Topology


class RecoveryError(TenplexError):
    """The state cannot be recovered (a partition lost every holder) or a recovery input is wrong."""


def replica_hosts(ptc: PTC, n: int) -> dict[str, tuple[str, ...]]:
    """Partition id -> hosts that get a store replica (sorted, none already holding it).

    Raises: RecoveryError when n < 0 or n >= the number of hosts."""
    hosts = sorted(ptc.topology.hosts)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(hosts):
        raise RecoveryError(f"store replicas n={n!r} must be an integer in [0, {len(hosts) - 1}] "
                            f"for {len(hosts)} hosts {hosts}")  # fmt: skip
    index = {h: i for i, h in enumerate(hosts)}
    host_of = ptc.topology.host_of
    out: dict[str, tuple[str, ...]] = {}
    for pid, devs in ptc.allocation.items:
        holders = {host_of(d) for d in devs}
        wanted = {hosts[(index[h] + k) % len(hosts)] for h in holders for k in range(1, n + 1)}
        out[pid] = tuple(sorted(wanted - holders))
    return out


def with_replicas(ptc: PTC, n: int) -> PTC:
    """`ptc` plus n store replicas of every partition on the next n hosts (module docstring).

    Raises: RecoveryError for n out of range."""
    targets = replica_hosts(ptc, n)
    next_id = max(d.id for d in ptc.topology.devices) + 1
    devices = list(ptc.topology.devices)
    items = []
    for pid, devs in ptc.allocation.items:
        added = []
        for host in targets[pid]:
            devices.append(Device(next_id, host))
            added.append(next_id)
            next_id += 1
        items.append((pid, devs + tuple(added)))
    return _with(ptc, Allocation(items), Topology(devices, ptc.topology.links))


def replication_plan(ptc: PTC, n: int, options: CompileOptions | None = None) -> tuple[PTC, Plan]:
    """(with_replicas(ptc, n), the verified plan that creates the replicas from ptc).

    Ranks are not re-placed (the replicas must land on their hosts), so the plan's allocation is
    the replicated PTC's. Raises: RecoveryError for n out of range; CompileError as compile_plan."""
    dst = with_replicas(ptc, n)
    return dst, compile_plan(ptc, dst, attrs.evolve(options or CompileOptions(), place_ranks=False))


def survivors(ptc: PTC, failed_hosts: Iterable[str]) -> PTC:
    """`ptc` without every device of `failed_hosts` (virtual replica devices included).

    Raises: RecoveryError naming an unknown failed host, or each partition whose every holder
    was on a failed host, with those hosts."""
    failed = set(failed_hosts)
    unknown = sorted(failed - set(ptc.topology.hosts))
    if unknown:
        raise RecoveryError(f"failed host(s) {unknown} are not in the topology (hosts: {sorted(ptc.topology.hosts)})")
    host_of = ptc.topology.host_of
    items, lost = [], []
    for pid, devs in ptc.allocation.items:
        kept = tuple(d for d in devs if host_of(d) not in failed)
        if not kept:
            lost.append(f"{pid!r} (on {sorted({host_of(d) for d in devs})})")
        items.append((pid, kept))
    if lost:
        raise RecoveryError(f"hosts {sorted(failed)} failed and {len(lost)} partition(s) lost every holder: "
                            f"{', '.join(lost)}; the state must be restored from a checkpoint")  # fmt: skip
    topo = Topology(tuple(d for d in ptc.topology.devices if d.host not in failed), ptc.topology.links)
    return _with(ptc, Allocation(items), topo)


def recovery_plan(ptc_with_replicas: PTC, failed_hosts: Iterable[str], dst: PTC,
                  options: CompileOptions | None = None) -> Plan:  # fmt: skip
    """The verified plan from the surviving holders of `ptc_with_replicas` to `dst`.

    Its src PTC is `survivors(ptc_with_replicas, failed_hosts)`. Raises: RecoveryError as
    `survivors`, or when dst has devices on a failed host; CompileError as compile_plan."""
    failed = sorted(set(failed_hosts))
    on_failed = sorted({d.host for d in dst.topology.devices} & set(failed))
    if on_failed:
        raise RecoveryError(f"the recovery layout uses failed host(s) {on_failed}")
    return compile_plan(survivors(ptc_with_replicas, failed), dst, options)


def onto_hosts(ptc: PTC, hosts: Sequence[str], first_device: int) -> PTC:
    """`ptc` moved onto `hosts`: its i-th host (in topology order) becomes hosts[i], and its
    devices are renumbered from `first_device` in id order (so they clash with no other PTC's).
    E.g. a 3-host layout from the parallelizer placed on the survivors h0, h2, h3.

    Raises: RecoveryError when the counts differ or hosts repeat."""
    old = ptc.topology.hosts
    if len(old) != len(hosts) or len(set(hosts)) != len(hosts):
        raise RecoveryError(f"cannot place a layout on hosts {list(old)} onto hosts {list(hosts)}")
    rename = dict(zip(old, hosts))
    renum = {d.id: first_device + i for i, d in enumerate(ptc.topology.devices)}
    topo = Topology(tuple(Device(renum[d.id], rename[d.host]) for d in ptc.topology.devices), ptc.topology.links)
    alloc = Allocation((pid, tuple(renum[d] for d in devs)) for pid, devs in ptc.allocation.items)
    return _with(ptc, alloc, topo)


def partition_bytes(ptc: PTC, pid: str) -> int:
    """Bytes of tensor data in one copy of a partition: its pieces, fill (padding) excluded."""
    subs = (ptc.subtensor_map[sid] for sid in ptc.partition_map[pid].subtensors)
    return sum(p.global_box.volume * ptc.itemsize(st.tensor) for st in subs for p in st.pieces)


def _with(ptc: PTC, alloc: Allocation, topo: Topology) -> PTC:
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, alloc, topo)
