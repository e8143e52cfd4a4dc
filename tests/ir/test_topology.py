"""Device, Links and Topology: one named case per verifier message, plus link classes."""

import re

import pytest

from tenplex.ir import Device, IRError, LinkClass, Links, Topology


def topo(*hosts: str, **links) -> Topology:
    return Topology(tuple(Device(i, h) for i, h in enumerate(hosts)), Links(**links))


INVALID = [
    pytest.param(lambda: Device(-1, "h0"), "device id -1 is not a non-negative integer", id="negative_id"),
    pytest.param(lambda: Device(True, "h0"), "device id True is not a non-negative integer", id="bool_id"),
    pytest.param(lambda: Device("0", "h0"), "device id '0' is not a non-negative integer", id="str_id"),
    pytest.param(lambda: Device(0, ""), "device 0 has host ''; expected a non-empty name", id="empty_host"),
    pytest.param(lambda: Device(3, None), "device 3 has host None; expected a non-empty name", id="none_host"),
    pytest.param(lambda: Links(network=0), "link bandwidth network=0 must be a positive number of bytes/s", id="zero_bw"),
    pytest.param(lambda: Links(host=-1.5), "link bandwidth host=-1.5 must be a positive number of bytes/s", id="neg_bw"),
    pytest.param(lambda: Links(device=True), "link bandwidth device=True must be a positive number of bytes/s", id="bool_bw"),
    pytest.param(lambda: Links(device="fast"), "link bandwidth device='fast' must be a positive number", id="str_bw"),
    pytest.param(
        lambda: Topology((Device(1, "h0"), Device(0, "h0"), Device(1, "h1"))), "device ids [1] appear more than once",
        id="duplicate_ids",
    ),
    pytest.param(lambda: topo("h0").host_of(9), "device 9 is not in the topology", id="unknown_device"),
    pytest.param(
        lambda: topo("h0", "h0").union(Topology((Device(1, "h1"),))), "device 1 is on host 'h0' in src but 'h1' in dst",
        id="union_host_conflict",
    ),
]


@pytest.mark.parametrize("build, message", INVALID)
def test_invalid_topology_message(build, message):
    with pytest.raises(IRError, match=re.escape(message)):
        build()


LINKS = [
    pytest.param(0, 0, LinkClass.DEVICE, id="same_device"),
    pytest.param(0, 1, LinkClass.HOST, id="same_host"),
    pytest.param(1, 2, LinkClass.NETWORK, id="other_host"),
]


@pytest.mark.parametrize("src, dst, link", LINKS)
def test_link_class(src, dst, link):
    t = topo("h0", "h0", "h1", network=5.0)
    assert t.link(src, dst) == t.link(dst, src) == link
    assert t.links.bandwidth(LinkClass.NETWORK) == 5.0


def test_devices_are_sorted_and_hosts_ordered_by_first_device():
    t = Topology((Device(3, "b"), Device(0, "a"), Device(1, "b")))
    assert [d.id for d in t.devices] == [0, 1, 3]
    assert t.hosts == ("a", "b") and t.devices_on("b") == (1, 3)
    assert t.has(3) and not t.has(2) and t.host_of(3) == "b"


def test_union_keeps_both_device_sets():
    u = topo("h0", "h0").union(Topology((Device(1, "h0"), Device(5, "h9"))))
    assert [(d.id, d.host) for d in u.devices] == [(0, "h0"), (1, "h0"), (5, "h9")]


def test_hosts_with_is_the_unions_host_map_and_refuses_what_it_refuses():
    a, b = topo("h0", "h0"), Topology((Device(1, "h0"), Device(5, "h9")))
    assert a.hosts_with(b) == {d.id: d.host for d in a.union(b).devices} == {0: "h0", 1: "h0", 5: "h9"}
    with pytest.raises(IRError, match="device 1 is on host 'h0' in src but 'h1' in dst"):
        a.hosts_with(Topology((Device(1, "h1"),)))


def test_devices_sort_by_key_as_by_their_own_order():
    """`Topology` sorts plain `Device`s by (id, host) read in C: the order of Device's own
    comparison, ties kept in input order (a sort of anything else falls back to `<`)."""
    import random

    from tenplex.ir.topology import _devices

    rng = random.Random(3)
    for _ in range(50):
        devices = [Device(rng.randrange(6), rng.choice("abc")) for _ in range(rng.randrange(12))]
        assert _devices(devices) == tuple(sorted(devices))
        assert [id(d) for d in _devices(devices)] == [id(d) for d in sorted(devices)]
    assert _devices(iter([Device(2, "b"), Device(1, "a")])) == (Device(1, "a"), Device(2, "b"))
