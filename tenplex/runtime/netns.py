"""Several emulated hosts on one machine: Linux network namespaces joined by a bridge.

`EmulatedHosts(n)` creates, all under one unique name prefix (`tpx<pid><k>` by default):
  * a "switch" namespace `<prefix>-sw` holding the bridge `<prefix>br` (the root namespace's
    networking is never touched: every link is created directly inside a namespace);
  * per host i a namespace `<prefix>-h<i>` with `lo` up and the host end `<prefix>h<i>` of a veth
    pair (address 10.213.<k>.<i+1>/24), whose other end `<prefix>s<i>` is a bridge port;
  * with `rate` (e.g. "1gbit", "100mbit"), a `tbf` qdisc on both ends of every veth pair, so each
    host's egress and ingress are shaped to `rate`;
  * with `mtu` (e.g. 9000, jumbo frames), that MTU on both ends of every veth pair (else the
    kernel's 1500). tbf counts each frame's headers against the rate: TCP payload reaches
    1448/1514 = 95.6% of `rate` at MTU 1500 and 8948/9014 = 99.3% at 9000.
The /24 is the first of 10.213.77.0/24, 10.213.78.0/24, ... that overlaps no route of the root
namespace. Exiting the context (also after an error, or a failure half-way through setup)
deletes the namespaces, which destroys the links and qdiscs inside them.

Needs root and iproute2 (`ip`, `tc`); `netns_unavailable_reason()` says why not, or None.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

_IFNAMSIZ = 15  # longest Linux interface name
_counter = itertools.count()
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,9}")


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed while building or tearing down the emulated hosts."""


@dataclass(frozen=True)
class Host:
    name: str  # "host<i>"
    netns: str  # namespace name, for `ip netns exec`
    address: str  # IPv4 address of the host's interface, without the /24
    iface: str  # the host end of its veth pair, inside `netns`


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _tc(netns: str, *args: str) -> None:
    p = subprocess.run(["ip", "netns", "exec", netns, "tc", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise NetnsError(f"tc {' '.join(args)} in {netns} failed ({p.returncode}): {p.stderr.strip()}")


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def _default_prefix() -> str:
    return f"tpx{_b36(os.getpid())}{_b36(next(_counter))}"


def _root_routes() -> list[ipaddress.IPv4Network]:
    p = _ip("-4", "-j", "route", "show", "table", "all", check=False)
    nets = []
    try:
        for r in json.loads(p.stdout or "[]"):
            dst = r.get("dst", "")
            if dst and dst != "default":
                with contextlib.suppress(ValueError):
                    nets.append(ipaddress.IPv4Network(dst, strict=False))
    except json.JSONDecodeError:
        pass
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    taken = _root_routes()
    for k in range(77, 256):
        net = ipaddress.IPv4Network(f"10.213.{k}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise NetnsError("no free /24 in 10.213.77.0 - 10.213.255.0 (all overlap routes of the root namespace)")


def _netns_list() -> set[str]:
    p = _ip("netns", "list", check=False)
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}


@functools.cache
def netns_unavailable_reason() -> str | None:
    """Why emulated hosts cannot be built on this machine, or None if they can (cached)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (apt-get install -y iproute2)"
    probe = f"{_default_prefix()}-probe"
    try:
        _ip("netns", "add", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace: {e}"
    try:
        _ip("-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
        _ip("-n", probe, "link", "add", "pbr", "type", "bridge")
        _tc(probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms")
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"veth, bridge or tbf unavailable in a network namespace: {e}"
    finally:
        _ip("netns", "delete", probe, check=False)
    return None


class EmulatedHosts:
    """`n` emulated hosts on one bridge; use as a context manager (see the module docstring)."""

    def __init__(
        self, n: int, *, rate: str | None = "1gbit", prefix: str | None = None, mtu: int | None = None
    ) -> None:
        if not 1 <= n <= 99:
            raise ValueError(f"n must be in 1..99, got {n}")
        if mtu is not None and not 576 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {mtu}")
        prefix = prefix if prefix is not None else _default_prefix()
        if not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, got {prefix!r}")
        self.n, self.rate, self.prefix, self.mtu = n, rate, prefix, mtu
        self.switch_netns = f"{prefix}-sw"
        self.bridge = f"{prefix}br"
        self.hosts: list[Host] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self._created: list[str] = []  # namespaces, in creation order

    def __enter__(self) -> EmulatedHosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_netns(self, name: str) -> None:
        if name in _netns_list():
            raise NetnsError(f"network namespace {name} already exists (prefix {self.prefix!r} in use)")
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _shape(self, netns: str, dev: str) -> None:
        if self.rate is not None:
            _tc(
                netns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms"
            )

    def _build(self) -> None:
        self.subnet = _pick_subnet()
        sw = self.switch_netns
        self._add_netns(sw)
        _ip("-n", sw, "link", "add", self.bridge, "type", "bridge")
        _ip("-n", sw, "link", "set", self.bridge, "up")
        base = self.subnet.network_address
        for i in range(self.n):
            ns, h_if, s_if = f"{self.prefix}-h{i}", f"{self.prefix}h{i}", f"{self.prefix}s{i}"
            assert len(h_if) <= _IFNAMSIZ and len(self.bridge) <= _IFNAMSIZ, (h_if, self.bridge)
            self._add_netns(ns)
            # both ends are born inside their namespaces: nothing ever appears in the root one
            mtu = ["mtu", str(self.mtu)] if self.mtu is not None else []
            _ip("-n", sw, "link", "add", s_if, *mtu, "type", "veth", "peer", "name", h_if, "netns", ns, *mtu)
            _ip("-n", sw, "link", "set", s_if, "master", self.bridge)
            _ip("-n", sw, "link", "set", s_if, "up")
            address = str(base + i + 1)
            _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", h_if)
            _ip("-n", ns, "link", "set", h_if, "up")
            self._shape(ns, h_if)
            self._shape(sw, s_if)
            self.hosts.append(Host(name=f"host{i}", netns=ns, address=address, iface=h_if))

    def close(self) -> None:
        """Delete every namespace this instance created (idempotent; keeps going on errors)."""
        errors = []
        for ns in reversed(self._created):
            p = _ip("netns", "delete", ns, check=False)
            if p.returncode != 0 and ns in _netns_list():
                errors.append(f"{ns}: {p.stderr.strip()}")
        self._created.clear()
        self.hosts = []
        if errors:
            raise NetnsError("could not delete network namespaces: " + "; ".join(errors))

    def kill(self, i: int) -> int:
        """Kill every process in host i's namespace (SIGKILL): the host is lost. Returns how many."""
        p = subprocess.run(["ip", "netns", "pids", self.hosts[i].netns], capture_output=True, text=True, timeout=30)
        pids = [int(x) for x in p.stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def run(self, i: int, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside host i's namespace (`ip netns exec`); returns the Popen."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[i].netns, *argv], **popen_kwargs)
