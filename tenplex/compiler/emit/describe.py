"""`describe(ptc)`: a readable account of a PTC for people (`tenplex inspect`).

Three parts: a table of partitions (id, devices, hosts, sub-tensors, bytes, values), totals
(tensors, logical bytes per dtype, bytes held on devices, devices, hosts), and notes in plain
words about what deserves a look: regions no sub-tensor holds (`PTC.uncovered`), sub-tensors
whose boxes overlap without being equal and elements held more than once (`ir.overlap`), fill
(padding) bytes, replicated partitions, devices that hold nothing. "complete" is said only when
there is nothing to note. Plain text, sorted, deterministic.
"""

from __future__ import annotations

from collections import Counter

from tenplex.compiler.emit.fmt import human_bytes, table
from tenplex.ir.overlap import extra_elements, overlaps
from tenplex.ir.ptc import PTC, Partition

_LIST = 4  # names shown before "+N more"


def _short(names: list[str]) -> str:
    more = f", +{len(names) - _LIST} more" if len(names) > _LIST else ""
    return ", ".join(names[:_LIST]) + more


def _partition_bytes(ptc: PTC, part: Partition) -> int:
    return sum(ptc.nbytes_of(ptc.subtensor_map[sid]) for sid in part.subtensors)


def _fill_bytes(ptc: PTC, sid: str) -> int:
    st = ptc.subtensor_map[sid]
    return sum(b.volume for b in st.fill_boxes()) * ptc.itemsize(st.tensor)


def _hosts_of(ptc: PTC, devices: tuple[int, ...]) -> list[str]:
    hosts = {ptc.topology.host_of(d) for d in devices}
    return [h for h in ptc.topology.hosts if h in hosts]


def _partitions(ptc: PTC) -> str:
    rows = []
    for part in ptc.partitions:
        devs = ptc.allocation.devices_of(part.id)
        values = [name for name, _ in part.values]
        rows.append([part.id, ",".join(map(str, devs)), ",".join(_hosts_of(ptc, devs)), len(part.subtensors),
                     human_bytes(_partition_bytes(ptc, part)), _short(values) or "-"])  # fmt: skip
    return table(["partition", "devices", "hosts", "sub-tensors", "bytes", "values"], rows, align="lllrrl")


def _totals(ptc: PTC) -> list[str]:
    by_dtype: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for t in ptc.tensors:
        by_dtype[t.dtype] += t.nbytes
        count[t.dtype] += 1
    held = sum(_partition_bytes(ptc, p) * len(ptc.allocation.devices_of(p.id)) for p in ptc.partitions)
    hosts = ptc.topology.hosts
    rows = [[dtype, count[dtype], human_bytes(n), n] for dtype, n in sorted(by_dtype.items())]
    return [
        f"  tensors:     {len(ptc.tensors)} ({human_bytes(sum(by_dtype.values()))} logical, each element once)",
        table(["dtype", "tensors", "bytes", "exact"], rows, align="lrrr", indent="    "),
        f"  sub-tensors: {len(ptc.subtensors)} in {len(ptc.partitions)} partitions",
        f"  held:        {human_bytes(held)} on devices (every partition times its replicas, fill included)",
        f"  devices:     {len(ptc.topology.devices)} ({len(ptc.allocation.by_device)} holding a partition)",
        f"  hosts:       {len(hosts)} ({_short(list(hosts))})",
    ]


def _gaps(ptc: PTC) -> list[str]:
    gaps = ptc.uncovered()
    out = []
    for name in sorted(gaps)[:_LIST]:
        boxes = gaps[name]
        missing = sum(b.volume for b in boxes) * ptc.itemsize(name)
        out.append(f"incomplete: tensor {name!r} has {len(boxes)} region(s) held by no sub-tensor, "
                   f"{human_bytes(missing)} in all, first {boxes[0]}")  # fmt: skip
    if len(gaps) > _LIST:
        out.append(f"incomplete: {len(gaps) - _LIST} more tensors have regions held by no sub-tensor")
    return out


def _overlaps(ptc: PTC) -> list[str]:
    found = overlaps(ptc, limit=1)
    out = []
    for name in sorted(found)[:_LIST]:
        o = found[name][0]
        out.append(f"overlapping: tensor {name!r} is held by sub-tensors whose boxes overlap without being equal: "
                   f"{o.a[0]!r} {o.a[1]} and {o.b[0]!r} {o.b[1]} both hold {o.common}")  # fmt: skip
    if len(found) > _LIST:
        out.append(f"overlapping: {len(found) - _LIST} more tensors are held by sub-tensors whose boxes overlap")
    return out


def _held_twice(ptc: PTC) -> list[str]:
    extra = extra_elements(ptc)
    if not extra:
        return []
    nbytes = sum(n * ptc.itemsize(name) for name, n in extra.items())
    return [f"held twice: {len(extra)} tensor(s) have elements held by more than one sub-tensor (e.g. norms kept "
            f"whole on every TP rank, tied embeddings), {human_bytes(nbytes)} beyond one copy: {_short(sorted(extra))}"]  # fmt: skip


def _fills(ptc: PTC) -> list[str]:
    padded = {sid: n for sid in sorted(ptc.subtensor_map) if (n := _fill_bytes(ptc, sid))}
    if not padded:
        return []
    total = sum(padded.values())
    return [f"padding: {len(padded)} sub-tensor(s) hold {human_bytes(total)} of fill (local regions no piece "
            f"covers, e.g. vocabulary padding): {_short(list(padded))}"]  # fmt: skip


def _replicas(ptc: PTC) -> list[str]:
    replicated = [
        (p, ptc.allocation.devices_of(p.id)) for p in ptc.partitions if len(ptc.allocation.devices_of(p.id)) > 1
    ]
    if not replicated:
        return []
    extra = sum(_partition_bytes(ptc, p) * (len(devs) - 1) for p, devs in replicated)
    names = [f"{p.id} x{len(devs)}" for p, devs in replicated]
    return [f"replicated: {len(replicated)} partition(s) are held on several devices (data-parallel replicas), "
            f"{human_bytes(extra)} beyond one copy: {_short(names)}"]  # fmt: skip


def _idle(ptc: PTC) -> list[str]:
    idle = [str(d.id) for d in ptc.topology.devices if d.id not in ptc.allocation.by_device]
    return [f"idle: {len(idle)} device(s) hold no partition: {_short(idle)}"] if idle else []


def describe(ptc: PTC) -> str:
    """The plain-text description of `ptc`, ending with a newline."""
    notes = _gaps(ptc) + _overlaps(ptc) + _held_twice(ptc) + _fills(ptc) + _replicas(ptc) + _idle(ptc)
    sections = [
        ["partitions:", _partitions(ptc)],
        ["totals:", *_totals(ptc)],
        ["notes:"] + [f"  - {n}" for n in notes or ["none: the PTC is complete, without fill or replicas"]],
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"
