"""Partitions (φ), allocations (α) and the Parallelizable Tensor Collection (T, σ, φ, α).

A `Partition` is what one rank holds together: sub-tensors plus non-tensor values. An
`Allocation` maps each partition to the devices holding it (several devices are DP replicas).

Invariants:
- tensor names, sub-tensor ids, partition ids are unique strings without NUL bytes (and so are
  value names);
- a sub-tensor names an existing tensor; its pieces' global boxes have the tensor's ndim and
  lie inside the tensor's shape;
- every sub-tensor belongs to exactly one partition, and partitions name existing sub-tensors;
- a value's policy is `replicated` (all holders agree; copied from src) or `per-rank`
  (re-derived for each rank by a rule; carried by dst, never copied);
- every partition (a string id) is allocated to >= 1 device (an integer id) of the topology,
  each device at most once, and the allocation names no unknown partition.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

import attrs

from tenplex.ir.box import Box, disjoint_union, subtract_all
from tenplex.ir.errors import IRError
from tenplex.ir.names import check_name
from tenplex.ir.tensor import SubTensor, TensorMeta, itemsize
from tenplex.ir.topology import Topology

POLICIES = ("replicated", "per-rank")


@attrs.frozen
class Value:
    """A non-tensor leaf (iteration, RNG state, args). `value` is JSON data; None with policy
    `replicated` means "inherit it from src"."""

    value: Any = None
    policy: str = "replicated"

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise IRError(f"value policy {self.policy!r} is not one of {list(POLICIES)}")


def _sorted_items(values: Mapping[str, Value] | Iterable[tuple[str, Value]]) -> tuple[tuple[str, Value], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple(sorted(items, key=lambda kv: kv[0]))


@attrs.frozen
class Partition:
    id: str
    subtensors: tuple[str, ...] = attrs.field(converter=tuple)
    values: tuple[tuple[str, Value], ...] = attrs.field(converter=_sorted_items, factory=tuple)

    def __attrs_post_init__(self) -> None:
        check_name("partition id", self.id)
        for sid in self.subtensors:
            check_name(f"partition {self.id!r} sub-tensor id", sid)
        for name, value in self.values:
            check_name(f"partition {self.id!r} value name", name)
            if not isinstance(value, Value):
                raise IRError(f"partition {self.id!r} value {name!r} is {value!r}, not a Value")
        if len(set(self.subtensors)) != len(self.subtensors):
            raise IRError(f"partition {self.id!r} lists a sub-tensor twice: {list(self.subtensors)}")
        names = [n for n, _ in self.values]
        if len(set(names)) != len(names):
            raise IRError(f"partition {self.id!r} has value names {names} with duplicates")

    @property
    def value_map(self) -> dict[str, Value]:
        return dict(self.values)


def _device_id(pid: str, d: Any) -> int:
    try:
        if isinstance(d, bool):
            raise TypeError
        return operator.index(d)
    except TypeError:
        raise IRError(f"partition {pid!r} is allocated to device {d!r}, which is not an integer device id") from None


def _alloc_items(values: Mapping[str, Iterable[int]] | Iterable[tuple[str, Iterable[int]]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    out = []
    for pid, devs in items:
        check_name("allocation partition id", pid)
        if isinstance(devs, (str, bytes, Mapping)) or not isinstance(devs, Iterable):
            raise IRError(f"partition {pid!r} is allocated to {devs!r}; expected a list of device ids")
        out.append((pid, tuple(_device_id(pid, d) for d in devs)))
    return tuple(sorted(out))


@attrs.frozen
class Allocation:
    """Partition id -> devices holding it (replicas)."""

    items: tuple[tuple[str, tuple[int, ...]], ...] = attrs.field(converter=_alloc_items)

    def __attrs_post_init__(self) -> None:
        pids = [pid for pid, _ in self.items]
        if len(set(pids)) != len(pids):
            raise IRError(f"allocation lists partitions {sorted({p for p in pids if pids.count(p) > 1})} more than once")
        for pid, devs in self.items:
            if not devs:
                raise IRError(f"partition {pid!r} is allocated to no device")
            if len(set(devs)) != len(devs):
                raise IRError(f"partition {pid!r} is allocated to devices {list(devs)} with duplicates")

    @cached_property
    def mapping(self) -> dict[str, tuple[int, ...]]:
        return dict(self.items)

    def devices_of(self, pid: str) -> tuple[int, ...]:
        return self.mapping[pid]

    @cached_property
    def by_device(self) -> dict[int, tuple[str, ...]]:
        out: dict[int, list[str]] = {}
        for pid, devs in self.items:
            for d in devs:
                out.setdefault(d, []).append(pid)
        return {d: tuple(p) for d, p in sorted(out.items())}

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(self.by_device)


def _by_key(key: str):
    def convert(values: Iterable[Any]) -> tuple[Any, ...]:
        return tuple(sorted(values, key=lambda v: getattr(v, key)))

    return convert


@attrs.frozen
class PTC:
    tensors: tuple[TensorMeta, ...] = attrs.field(converter=_by_key("name"))
    subtensors: tuple[SubTensor, ...] = attrs.field(converter=_by_key("id"))
    partitions: tuple[Partition, ...] = attrs.field(converter=_by_key("id"))
    allocation: Allocation
    topology: Topology

    def __attrs_post_init__(self) -> None:
        for kind, items, key in (("tensor", self.tensors, "name"), ("sub-tensor", self.subtensors, "id"), ("partition", self.partitions, "id")):
            seen: set[str] = set()
            for item in items:
                name = getattr(item, key)
                if name in seen:
                    raise IRError(f"{kind} {name!r} is defined twice")
                seen.add(name)
        self._verify_subtensors()
        self._verify_partitions()
        self._verify_allocation()

    def _verify_subtensors(self) -> None:
        tensors = self.tensor_map
        for st in self.subtensors:
            meta = tensors.get(st.tensor)
            if meta is None:
                raise IRError(f"sub-tensor {st.id!r} names unknown tensor {st.tensor!r}")
            for i, p in enumerate(st.pieces):
                if p.global_box.ndim != len(meta.shape) or not meta.box.contains(p.global_box):
                    raise IRError(f"sub-tensor {st.id!r} piece {i} global box {p.global_box} is outside tensor {meta.name!r} of shape {meta.shape}")

    def _verify_partitions(self) -> None:
        owner: dict[str, str] = {}
        subs = self.subtensor_map
        for part in self.partitions:
            for sid in part.subtensors:
                if sid not in subs:
                    raise IRError(f"partition {part.id!r} names unknown sub-tensor {sid!r}")
                if sid in owner:
                    raise IRError(f"sub-tensor {sid!r} is in partitions {owner[sid]!r} and {part.id!r}")
                owner[sid] = part.id
        missing = [st.id for st in self.subtensors if st.id not in owner]
        if missing:
            raise IRError(f"sub-tensors {missing[:5]} belong to no partition")

    def _verify_allocation(self) -> None:
        parts = self.partition_map
        alloc = self.allocation.mapping
        for pid in alloc:
            if pid not in parts:
                raise IRError(f"allocation names unknown partition {pid!r}")
        for pid in parts:
            if pid not in alloc:
                raise IRError(f"partition {pid!r} is not allocated to any device")
            for d in alloc[pid]:
                if not self.topology.has(d):
                    raise IRError(f"partition {pid!r} is allocated to device {d}, which is not in the topology")

    def with_allocation(self, allocation: Allocation) -> PTC:
        """This PTC with another allocation. Only the allocation is re-verified: tensors,
        sub-tensors and partitions are unchanged (so this costs O(partitions), not O(PTC))."""
        new = copy.copy(self)
        object.__setattr__(new, "allocation", allocation)
        new._verify_allocation()
        return new

    @cached_property
    def tensor_map(self) -> dict[str, TensorMeta]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def subtensor_map(self) -> dict[str, SubTensor]:
        return {s.id: s for s in self.subtensors}

    @cached_property
    def partition_map(self) -> dict[str, Partition]:
        return {p.id: p for p in self.partitions}

    @cached_property
    def partition_of(self) -> dict[str, str]:
        """Sub-tensor id -> partition id."""
        return {sid: p.id for p in self.partitions for sid in p.subtensors}

    def devices_of_subtensor(self, sid: str) -> tuple[int, ...]:
        return self.allocation.devices_of(self.partition_of[sid])

    @cached_property
    def by_tensor(self) -> dict[str, tuple[SubTensor, ...]]:
        out: dict[str, list[SubTensor]] = {t.name: [] for t in self.tensors}
        for st in self.subtensors:
            out[st.tensor].append(st)
        return {k: tuple(v) for k, v in out.items()}

    def nbytes_of(self, st: SubTensor) -> int:
        return st.volume * self.itemsize(st.tensor)

    @cached_property
    def itemsizes(self) -> dict[str, int]:
        return {t.name: itemsize(t.dtype) for t in self.tensors}

    def itemsize(self, tensor: str) -> int:
        return self.itemsizes[tensor]

    def uncovered(self) -> dict[str, list[Box]]:
        """Regions of each tensor that no sub-tensor holds (empty for a *complete* PTC)."""
        out = {}
        for meta in self.tensors:
            rest = [meta.box] if meta.box.volume else []
            held = disjoint_union(p.global_box for st in self.by_tensor[meta.name] for p in st.pieces)
            for box in held:
                rest = subtract_all(rest, box)
            if rest:
                out[meta.name] = rest
        return out

    def check_complete(self) -> None:
        """Raises IRError naming the first tensor region that no sub-tensor holds."""
        gaps = self.uncovered()
        if gaps:
            name = sorted(gaps)[0]
            raise IRError(f"PTC is incomplete: tensor {name!r} region {gaps[name][0]} is held by no sub-tensor")
