"""Emulated hosts in network namespaces: reachability over the bridge (TCP echo from two hosts),
tbf shaping (an 8 MiB transfer at 100mbit lands between loose bounds), and teardown (no
namespace or interface with the prefix left, also after an error in the body or in setup).

Processes inside the namespaces are `python -c` one-liners; every one is killed in `finally`.
The module skips, with the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tenplex.runtime.netns import EmulatedHosts, NetnsError, netns_unavailable_reason

REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=f"netns unavailable: {REASON}")]

PORT = 47123

ECHO_SERVER = f"""
import socket
s = socket.create_server(("0.0.0.0", {PORT}))
print("ready", flush=True)
for _ in range(2):
    c, _ = s.accept()
    with c:
        while data := c.recv(65536):
            c.sendall(data)
"""

CLIENT_PRELUDE = """
import socket, sys, time
def connect(addr, port):
    deadline = time.monotonic() + 5
    while True:
        try:
            return socket.create_connection((addr, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
"""

ECHO_CLIENT = (
    CLIENT_PRELUDE
    + """
c = connect(sys.argv[1], int(sys.argv[2]))
msg = ("hello from " + sys.argv[3]).encode()
c.sendall(msg)
c.shutdown(socket.SHUT_WR)
got = b""
while data := c.recv(65536):
    got += data
print(got.decode(), flush=True)
"""
)

SINK_SERVER = f"""
import socket, time
s = socket.create_server(("0.0.0.0", {PORT}))
print("ready", flush=True)
c, _ = s.accept()
t0 = time.monotonic()
n = 0
while data := c.recv(1 << 20):
    n += len(data)
print(n, time.monotonic() - t0, flush=True)
"""

SOURCE_CLIENT = (
    CLIENT_PRELUDE
    + """
c = connect(sys.argv[1], int(sys.argv[2]))
c.sendall(bytes(int(sys.argv[3])))
c.close()
"""
)


def _start(hosts: EmulatedHosts, i: int, script: str, *args: str, procs: list) -> subprocess.Popen:
    p = hosts.run(i, [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    return p


def _wait_ready(p: subprocess.Popen) -> None:
    line = p.stdout.readline()
    assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def _leftovers(prefix: str) -> tuple[list[str], list[str]]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [x for x in ns.splitlines() if prefix in x], [x for x in links.splitlines() if prefix in x]


@pytest.mark.timeout(20)
def test_tcp_echo_between_hosts():
    procs: list[subprocess.Popen] = []
    with EmulatedHosts(3, rate=None) as hosts:
        try:
            assert [h.address for h in hosts.hosts] == [str(hosts.subnet.network_address + k) for k in (1, 2, 3)]
            assert len({h.netns for h in hosts.hosts}) == 3
            server = _start(hosts, 0, ECHO_SERVER, procs=procs)
            _wait_ready(server)
            clients = [
                _start(hosts, i, ECHO_CLIENT, hosts.hosts[0].address, str(PORT), hosts.hosts[i].name, procs=procs)
                for i in (1, 2)
            ]
            for i, c in zip((1, 2), clients):
                out, err = c.communicate(timeout=10)
                assert c.returncode == 0, err
                assert out.strip() == f"hello from host{i}"
            server.wait(timeout=5)
            assert server.returncode == 0, server.stderr.read()
        finally:
            _stop(procs)


@pytest.mark.timeout(25)
def test_tbf_shapes_throughput():
    size = 8 << 20
    procs: list[subprocess.Popen] = []
    with EmulatedHosts(2, rate="100mbit") as hosts:
        try:
            sink = _start(hosts, 0, SINK_SERVER, procs=procs)
            _wait_ready(sink)
            src = _start(hosts, 1, SOURCE_CLIENT, hosts.hosts[0].address, str(PORT), str(size), procs=procs)
            out, err = sink.communicate(timeout=15)
            assert sink.returncode == 0, err
            assert src.wait(timeout=5) == 0, src.stderr.read()
            n, seconds = out.split()
            assert int(n) == size
            mbit_s = size * 8 / float(seconds) / 1e6
            assert 40 < mbit_s < 150, f"{mbit_s:.1f} Mbit/s through a 100mbit tbf"
        finally:
            _stop(procs)


@pytest.mark.timeout(20)
def test_teardown_leaves_nothing():
    prefix = f"tpxt{os.getpid():x}"  # unique per process: concurrent runs do not collide
    # clean exit
    with EmulatedHosts(2, prefix=prefix) as hosts:
        ns, _ = _leftovers(prefix)
        assert len(ns) == 3  # two hosts and the switch
    assert _leftovers(prefix) == ([], [])
    # an error in the body
    with pytest.raises(RuntimeError, match="boom"), EmulatedHosts(2, prefix=prefix):
        raise RuntimeError("boom")
    assert _leftovers(prefix) == ([], [])
    # a failure half-way through setup (tc rejects the rate after the first namespaces exist)
    with pytest.raises(NetnsError), EmulatedHosts(2, rate="notarate", prefix=prefix):
        pytest.fail("setup should have failed")
    assert _leftovers(prefix) == ([], [])
    assert hosts.hosts == []


@pytest.mark.timeout(20)
def test_mtu_is_set_on_both_ends_of_every_link():
    with EmulatedHosts(2, rate="1gbit", mtu=9000) as hosts:
        for h in hosts.hosts:
            link = subprocess.run(
                ["ip", "-n", h.netns, "-j", "link", "show", h.iface], capture_output=True, text=True, check=True
            )
            assert json.loads(link.stdout)[0]["mtu"] == 9000
        ports = subprocess.run(
            ["ip", "-n", hosts.switch_netns, "-j", "link"], capture_output=True, text=True, check=True
        )
        assert {p["ifname"]: p["mtu"] for p in json.loads(ports.stdout) if p["ifname"] != "lo"} == {
            hosts.bridge: 9000, **{f"{hosts.prefix}s{i}": 9000 for i in range(2)}}  # fmt: skip


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mtu must be in 576..65535, got 100"):
        EmulatedHosts(2, mtu=100)
    with pytest.raises(ValueError):
        EmulatedHosts(0)
    with pytest.raises(ValueError):
        EmulatedHosts(2, prefix="Bad-Prefix")
