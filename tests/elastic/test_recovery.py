"""Failure recovery: store replicas on the next n hosts, survivors, recovery plans; then on real
agents (spawned `Runtime.local` agents, and `tenplex agent`s on emulated hosts) with one agent
killed, checked byte for byte against the arange oracle.

Every runtime test has a hard timeout; agents are always stopped (or killed) by context managers.
"""

from __future__ import annotations

import pytest

from tenplex.compiler import compile_plan
from tenplex.elastic.recovery import (
    RecoveryError,
    onto_hosts,
    partition_bytes,
    recovery_plan,
    replica_hosts,
    replication_plan,
    survivors,
    with_replicas,
)
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_state
from tenplex.runtime.transport.ucx import ucx_available

MODEL = "gpt-tiny:layers=12,hidden=64,heads=4,ffn=256,vocab=512"
SRC = f"{MODEL},tp2,pp2,dp1@4x1"  # 4 partitions, one per host
DST3 = f"{MODEL},tp1,pp3,dp1@3x1"  # the recovery layout, placed on the 3 survivors
HOSTS = ["h0", "h1", "h2", "h3"]
JOB = "j"
_UCX = ucx_available()


def _dst_on(ptc, hosts, spec=DST3):
    return onto_hosts(ptc_from_spec(spec), hosts, max(d.id for d in ptc.topology.devices) + 1)


# ---- pure: replicas, survivors, plans ------------------------------------------------------
@pytest.mark.parametrize("n, want", [
    (0, {"pp0-tp0": (), "pp0-tp1": (), "pp1-tp0": (), "pp1-tp1": ()}),
    (1, {"pp0-tp0": ("h1",), "pp0-tp1": ("h2",), "pp1-tp0": ("h3",), "pp1-tp1": ("h0",)}),
    (2, {"pp0-tp0": ("h1", "h2"), "pp0-tp1": ("h2", "h3"), "pp1-tp0": ("h0", "h3"), "pp1-tp1": ("h0", "h1")}),
])  # fmt: skip
def test_replicas_go_round_robin_to_the_next_n_hosts(n, want):
    src = ptc_from_spec(SRC)
    assert replica_hosts(src, n) == want
    rep = with_replicas(src, n)
    assert [d.id for d in rep.topology.devices] == list(range(4 + 4 * n))  # new ids after the old ones
    for pid, devs in rep.allocation.items:
        assert devs[:1] == src.allocation.devices_of(pid)
        assert tuple(rep.topology.host_of(d) for d in devs[1:]) == want[pid]


def test_dp_replicas_are_not_duplicated_and_n_is_checked():
    src = ptc_from_spec(f"{MODEL},tp2,pp1,dp2@4x1")  # each partition on two hosts already
    want = {"pp0-tp0": ("h1", "h3"), "pp0-tp1": ("h0", "h2")}  # holders h0, h2 and h1, h3
    assert replica_hosts(src, 1) == replica_hosts(src, 2) == replica_hosts(src, 3) == want
    for n in (-1, 4, True):
        with pytest.raises(RecoveryError, match=rf"store replicas n={n!r} must be an integer in \[0, 3\] for 4 hosts"):
            with_replicas(src, n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_replication_moves_each_partition_to_n_hosts_over_the_network(n):
    src = ptc_from_spec(f"{MODEL},tied=false,tp1,pp4,dp1@4x1")  # partitions share no tensor region
    rep, plan = replication_plan(src, n)
    assert plan.allocation == rep.allocation  # ranks are not re-placed
    want = n * sum(partition_bytes(src, p.id) for p in src.partitions)
    assert plan.stats.network_bytes == plan.stats.network_lower_bound_bytes == want
    assert plan.stats.host_bytes == 0


def test_survivors_drop_failed_devices_and_keep_replicas():
    rep = with_replicas(ptc_from_spec(SRC), 1)
    left = survivors(rep, ["h1"])
    assert sorted({d.host for d in left.topology.devices}) == ["h0", "h2", "h3"]
    assert left.allocation.mapping == {"pp0-tp0": (0,), "pp0-tp1": (5,), "pp1-tp0": (2, 6), "pp1-tp1": (3, 7)}
    assert survivors(rep, []).allocation == rep.allocation


def test_two_adjacent_failures_with_one_replica_name_the_lost_partition():
    rep = with_replicas(ptc_from_spec(SRC), 1)
    lost = r"hosts \['h1', 'h2'\] failed and 1 partition\(s\) lost every holder: 'pp0-tp1' \(on \['h1', 'h2'\]\)"
    with pytest.raises(RecoveryError, match=lost) as info:
        recovery_plan(rep, ["h1", "h2"], _dst_on(rep, ["h0", "h3"], f"{MODEL},tp1,pp2,dp1@2x1"))
    assert isinstance(info.value, TenplexError)
    survivors(with_replicas(ptc_from_spec(SRC), 2), ["h1", "h2"])  # n=2 survives two adjacent failures
    with pytest.raises(RecoveryError, match=r"'pp0-tp0' \(on \['h0'\]\), 'pp0-tp1' \(on \['h1'\]\)"):
        survivors(ptc_from_spec(SRC), ["h0", "h1"])


def test_recovery_inputs_are_checked():
    rep = with_replicas(ptc_from_spec(SRC), 1)
    with pytest.raises(RecoveryError, match=r"failed host\(s\) \['h9'\] are not in the topology"):
        survivors(rep, ["h9"])
    with pytest.raises(RecoveryError, match=r"the recovery layout uses failed host\(s\) \['h1'\]"):
        recovery_plan(rep, ["h1"], _dst_on(rep, ["h0", "h1", "h2"]))
    with pytest.raises(
        RecoveryError, match=r"cannot place a layout on hosts \['h0', 'h1', 'h2'\] onto hosts \['h0', 'h0', 'h2'\]"
    ):
        _dst_on(rep, ["h0", "h0", "h2"])


def test_recovery_plan_reads_only_survivors_and_dp_replicas_suffice():
    rep = with_replicas(ptc_from_spec(SRC), 1)
    dst = _dst_on(rep, ["h0", "h2", "h3"])
    plan = recovery_plan(rep, ["h1"], dst)
    left = survivors(rep, ["h1"])
    assert plan.stats.network_bytes == plan.stats.network_lower_bound_bytes > 0
    assert {h for m in plan.messages for h in (m.src_host, m.dst_host)} <= {"h0", "h2", "h3"}
    assert plan == compile_plan(left, dst)
    dp = ptc_from_spec(f"{MODEL},tp2,pp1,dp2@4x1")  # no store replicas: DP copies on h2, h3
    recovery_plan(dp, ["h0", "h1"], _dst_on(dp, ["h2", "h3"], f"{MODEL},tp1,pp2,dp1@2x1"))


# ---- runtime: real agents, one killed ------------------------------------------------------
def _load(rt, src):
    tensors = arange_tensors(src)
    values = arange_values(src)
    rt.load(JOB, "v0", src, materialize_all(src, tensors), values)
    return tensors


def _assert_oracle(rt, tag, placed, tensors) -> None:
    assert check_state(placed, tensors, rt.fetch(JOB, tag)[0]) > 0


def _recover_local(src_spec: str, n: int, failed: str, dst_spec: str) -> None:
    """Load, replicate, kill `failed`'s agent, recover onto the survivors, check every dst byte."""
    from tenplex.runtime.runtime import Runtime

    src = ptc_from_spec(src_spec)
    rep, plan = replication_plan(src, n)
    alive = [h for h in HOSTS if h != failed]
    with Runtime.local(HOSTS, timeout=10.0, round_timeout=30.0, start_timeout=30.0) as rt:
        tensors = _load(rt, src)
        rt.execute(plan, src, rep, JOB, "v0", "rep")
        _assert_oracle(rt, "rep", rep, tensors)
        proc = rt.agents[failed].proc
        proc.kill()
        proc.join(10)
        rest = Runtime({h: rt.agents[h] for h in alive}, round_timeout=30.0)  # the survivors' agents
        dst = _dst_on(rep, alive, dst_spec)
        recovery = recovery_plan(rep, [failed], dst)
        rest.execute(recovery, survivors(rep, [failed]), dst, JOB, "rep", "v1")
        _assert_oracle(rest, "v1", dst.with_allocation(recovery.allocation), tensors)
        assert rest.exists(JOB, "v1") == dict.fromkeys(alive, True)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.skipif(_UCX is not None, reason=f"ucxx cannot be imported: {_UCX}")
def test_local_agents_recover_from_store_replicas_after_one_dies():
    _recover_local(SRC, 1, "h1", DST3)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.skipif(_UCX is not None, reason=f"ucxx cannot be imported: {_UCX}")
def test_local_agents_recover_from_dp_replicas_alone():
    _recover_local(f"{MODEL},tp2,pp1,dp2@4x1", 0, "h2", DST3)


@pytest.mark.netns
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.skipif(_UCX is not None, reason=f"ucxx cannot be imported: {_UCX}")
def test_emulated_hosts_recover_after_an_agent_is_killed():
    from tenplex.runtime.agent.fleet import AgentFleet
    from tenplex.runtime.netns import EmulatedHosts, netns_unavailable_reason
    from tenplex.runtime.runtime import Runtime

    if netns_unavailable_reason() is not None:
        pytest.skip(netns_unavailable_reason())
    src = ptc_from_spec(SRC)
    rep, plan = replication_plan(src, 1)
    alive = ["h0", "h1", "h3"]
    dst = _dst_on(rep, alive)
    with EmulatedHosts(4, rate="1gbit") as net, AgentFleet(HOSTS, hosts=net, timeout=10.0) as fleet:
        with Runtime.connect(fleet.controls, round_timeout=30.0) as rt:
            tensors = _load(rt, src)
            rt.execute(plan, src, rep, JOB, "v0", "rep")
        fleet.kill("h2")
        with Runtime.connect({h: fleet.controls[h] for h in alive}, round_timeout=30.0) as rt:
            recovery = recovery_plan(rep, ["h2"], dst)
            rt.execute(recovery, survivors(rep, ["h2"]), dst, JOB, "rep", "v1")
            _assert_oracle(rt, "v1", dst.with_allocation(recovery.allocation), tensors)
