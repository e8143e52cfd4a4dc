"""Devices, hosts and link classes.

A reconfiguration moves bytes over three link classes: `device` (both ends on one device),
`host` (two devices of one host: NVLink or shared memory) and `network` (two hosts).

Invariants:
- device ids are unique non-negative integers; host names are non-empty, without NUL bytes;
- link bandwidths are positive (bytes per second).
"""

from __future__ import annotations

import enum
from functools import cached_property
from operator import attrgetter

import attrs

from tenplex.ir.errors import IRError


class LinkClass(enum.Enum):
    DEVICE = "device"
    HOST = "host"
    NETWORK = "network"


@attrs.frozen(order=True)
class Device:
    id: int
    host: str

    def __attrs_post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise IRError(f"device id {self.id!r} is not a non-negative integer")
        if not isinstance(self.host, str) or not self.host or "\x00" in self.host:
            raise IRError(f"device {self.id} has host {self.host!r}; expected a non-empty name without NUL bytes")


@attrs.frozen
class Links:
    """Bandwidth of each link class in bytes/s (defaults: HBM copy, NVLink, 100 Gbit/s NIC)."""

    device: float = 1.0e12
    host: float = 1.5e11
    network: float = 12.5e9

    def __attrs_post_init__(self) -> None:
        for name in ("device", "host", "network"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise IRError(f"link bandwidth {name}={value!r} must be a positive number of bytes/s")

    def bandwidth(self, link: LinkClass) -> float:
        return float(getattr(self, link.value))


_ORDER = attrgetter("id", "host")  # Device's own order (attrs compares its fields' tuple), read in C


def _devices(values: object) -> tuple[Device, ...]:
    values = list(values)  # type: ignore[call-overload]
    if all(type(v) is Device for v in values):  # 1024 devices: ~10k compares, each a Python call of attrs'
        return tuple(sorted(values, key=_ORDER))
    return tuple(sorted(values))


@attrs.frozen
class Topology:
    devices: tuple[Device, ...] = attrs.field(converter=_devices)
    links: Links = Links()

    def __attrs_post_init__(self) -> None:
        ids = [d.id for d in self.devices]
        dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
        if dup:
            raise IRError(f"device ids {dup} appear more than once")

    @cached_property
    def _host_of(self) -> dict[int, str]:
        return {d.id: d.host for d in self.devices}

    def host_of(self, device: int) -> str:
        try:
            return self._host_of[device]
        except KeyError:
            raise IRError(f"device {device} is not in the topology") from None

    def has(self, device: int) -> bool:
        return device in self._host_of

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        """Host names in order of their first device id."""
        return tuple(dict.fromkeys(d.host for d in self.devices))

    def devices_on(self, host: str) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices if d.host == host)

    def link(self, src: int, dst: int) -> LinkClass:
        if src == dst:
            return LinkClass.DEVICE
        if self.host_of(src) == self.host_of(dst):
            return LinkClass.HOST
        return LinkClass.NETWORK

    def hosts_with(self, other: Topology) -> dict[int, str]:
        """Device -> host over both device sets (what `union` holds, without building and
        sorting a Topology); a device in both must be on the same host."""
        merged = dict(self._host_of)
        for d in other.devices:
            if merged.setdefault(d.id, d.host) != d.host:
                raise IRError(f"device {d.id} is on host {merged[d.id]!r} in src but {d.host!r} in dst")
        return merged

    def union(self, other: Topology) -> Topology:
        """Both device sets; a device in both must be on the same host."""
        return Topology(tuple(Device(i, h) for i, h in self.hosts_with(other).items()), self.links)
