"""`Runtime.execute` on two emulated hosts: one agent process each, UCX between them.

Every test has a hard timeout; agents are always stopped (or killed) in `finally` via the
context manager; UCX waits inside agents are bounded by a short timeout so failure cases end fast.
"""

from __future__ import annotations

import attrs
import pytest

from tenplex.compiler.compile import compile_plan
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.ir.box import Box
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_state
from tenplex.runtime.transport.ucx import ucx_available

_REASON = ucx_available()
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(_REASON is not None, reason=f"ucxx cannot be imported: {_REASON}"),
]

SRC, DST = "gpt-tiny:tp2,pp1,dp1@2x1", "gpt-tiny:tp1,pp1,dp2@2x1"
HOSTS = ["h0", "h1"]
JOB = "j"


@pytest.fixture(scope="module")
def case():
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec(SRC), ptc_from_spec(DST)
    plan = compile_plan(src, dst)
    tensors = arange_tensors(src)
    values = arange_values(src)
    return src, dst, plan, tensors, materialize_all(src, tensors), values


def _runtime(src, arrays, values, timeout: float = 20.0):
    from tenplex.runtime.runtime import Runtime

    rt = Runtime.local(HOSTS, timeout=timeout, round_timeout=30.0, start_timeout=30.0)
    try:
        rt.load(JOB, "v0", src, arrays, values)
    except BaseException:
        rt.close()
        raise
    return rt


def _assert_src_intact(rt, arrays, values) -> None:
    got_arrays, got_values = rt.fetch(JOB, "v0")
    assert got_arrays.keys() == arrays.keys()
    assert all(got_arrays[k].tobytes() == a.tobytes() for k, a in arrays.items())
    assert got_values == values


def _assert_nothing_committed(rt) -> None:
    assert rt.exists(JOB, "v1") == dict.fromkeys(HOSTS, False)
    assert rt.exists(JOB, ".staging-v1") == dict.fromkeys(HOSTS, False)


@pytest.mark.timeout(60)
def test_execute_matches_oracle_and_commits_only_at_the_end(case):
    src, dst, plan, tensors, arrays, values = case
    assert plan.stats.network_bytes > 0
    assert {m.src_host != m.dst_host for m in plan.messages} == {True, False}  # network and local
    assert any(isinstance(op, FillOp) for op in plan.ops) and any(isinstance(op, ValueOp) for op in plan.ops)
    with _runtime(src, arrays, values) as rt:
        _assert_nothing_committed(rt)
        sent = rt.execute(plan, src, dst, JOB, "v0", "v1")
        assert sum(sent.values()) == plan.stats.network_bytes
        # one node: every part went by a copy into the peer's shared memory, none through UCX
        assert {h: s["transport_bytes"] for h, s in rt.host_seconds.items()} == dict.fromkeys(HOSTS, 0)
        assert {h: s["direct_bytes"] for h, s in rt.host_seconds.items()} == sent
        # fresh agents: each sender mapped its peer's arena anew (page tables filled on the clock)
        assert all(rt.host_seconds[h]["mapped_bytes"] >= n > 0 for h, n in sent.items())
        assert rt.exists(JOB, "v1") == dict.fromkeys(HOSTS, True)
        assert rt.exists(JOB, ".staging-v1") == dict.fromkeys(HOSTS, False)
        got, got_values = rt.fetch(JOB, "v1")
        assert check_state(dst.with_allocation(plan.allocation), tensors, got) > 0
        # every dst value: copied from src where the op says so, else the op's value
        for op in plan.ops:
            if isinstance(op, ValueOp):
                expected_value = values[(op.src_partition, op.src_device)][op.name] if op.src_partition else op.value
                assert got_values[(op.dst_partition, op.dst_device)][op.name] == expected_value
        _assert_src_intact(rt, arrays, values)
        with pytest.raises(ExecutionError, match="already exists"):  # no silent overwrite of a tag
            rt.execute(plan, src, dst, JOB, "v0", "v1")
        assert rt.exists(JOB, "v1") == dict.fromkeys(HOSTS, True)
        # again on the same agents: v1's arenas (its old bytes in them) are recycled for v2, and
        # progress is reported for every round
        rt.drop(JOB, "v1")
        rounds: list[tuple[int, int]] = []
        assert rt.execute(plan, src, dst, JOB, "v0", "v2", on_round=lambda *r: rounds.append(r)) == sent
        # each peer answered yes before: the offers were sure (no answer), the parts still direct,
        # into the recycled arenas that the senders still map
        assert {h: s["direct_bytes"] for h, s in rt.host_seconds.items()} == sent
        assert {h: s["mapped_bytes"] for h, s in rt.host_seconds.items()} == dict.fromkeys(HOSTS, 0)
        assert rounds == [(r + 1, plan.stats.rounds) for r in range(plan.stats.rounds)]
        assert check_state(dst.with_allocation(plan.allocation), tensors, rt.fetch(JOB, "v2")[0]) > 0
        # each agent kept its decoded slice: a prepare naming only the slice id runs (then aborted);
        # an id never sent is refused, naming it and the agent
        sid = rt.agents["h0"].slice_id
        assert sid is not None and rt.agents["h1"].slice_id == sid
        got = rt.call("h1", "prepare", job=JOB, src_tag="v0", dst_tag="v3", slice_id=sid)
        assert set(got) == {"gives", "prepare_s"} and rt.call("h1", "abort", job=JOB, dst_tag="v3") is True
        with pytest.raises(ExecutionError, match=r"slice id 'other' was not sent to agent 'h1' on this connection"):
            rt.call("h1", "prepare", job=JOB, src_tag="v0", dst_tag="v3", slice_id="other")
        assert rt.exists(JOB, ".staging-v3") == dict.fromkeys(HOSTS, False)


@pytest.mark.timeout(60)
def test_a_reserved_pool_is_mapped_by_the_peers_before_the_first_execute(case):
    """`Runtime.reserve`: each agent pools an arena and its same-node peer maps it, so fresh agents'
    first execute writes into memory that is faulted in on both sides: nothing mapped on its clock."""
    import math

    from tenplex.runtime.arrays import np_dtype
    from tenplex.runtime.store.shared import layout

    src, dst, plan, tensors, arrays, values = case
    placed = dst.with_allocation(plan.allocation)
    size = max(layout([math.prod(st.shape) * np_dtype(placed.tensor_map[st.tensor].dtype).itemsize
                       for st in placed.subtensors for d in placed.devices_of_subtensor(st.id)
                       if placed.topology.host_of(d) == h])[1] for h in HOSTS)  # fmt: skip
    with _runtime(src, arrays, values) as rt:
        assert rt.reserve(size) == dict.fromkeys(HOSTS, size)
        sent = rt.execute(plan, src, dst, JOB, "v0", "v1")
        assert {h: s["direct_bytes"] for h, s in rt.host_seconds.items()} == sent and all(sent.values())
        assert {h: s["mapped_bytes"] for h, s in rt.host_seconds.items()} == dict.fromkeys(HOSTS, 0)
        assert check_state(placed, tensors, rt.fetch(JOB, "v1")[0]) > 0
        _assert_src_intact(rt, arrays, values)


@pytest.mark.timeout(60)
def test_parts_into_mapped_files_go_through_ucx_and_the_rest_by_copy(case, tmp_path):
    """h1's dst arrays are new `.npy` files, not in an arena: h1 refuses h0's copies, so h0's parts
    to h1 travel through UCX while h1's parts to h0 still go by a copy into h0's arena."""
    src, dst, plan, tensors, arrays, values = case
    placed = dst.with_allocation(plan.allocation)
    mine = [(st.id, d) for st in placed.subtensors for d in placed.devices_of_subtensor(st.id)
            if placed.topology.host_of(d) == "h1"]  # fmt: skip
    files = {"h1": [(sid, d, str(tmp_path / f"{k}.npy")) for k, (sid, d) in enumerate(mine)]}
    with _runtime(src, arrays, values) as rt:
        sent = rt.execute(plan, src, dst, JOB, "v0", "v1", files=files)
        assert sum(sent.values()) == plan.stats.network_bytes
        ways = {h: (s["direct_bytes"], s["transport_bytes"]) for h, s in rt.host_seconds.items()}
        assert ways == {"h0": (0, sent["h0"]), "h1": (sent["h1"], 0)} and sent["h0"] > 0 and sent["h1"] > 0
        assert check_state(placed, tensors, rt.fetch(JOB, "v1")[0]) > 0
    assert len(list(tmp_path.glob("*.npy"))) == len(mine)


@pytest.mark.timeout(60)
def test_rounds_that_forward_what_earlier_rounds_received_wait_for_their_done():
    """DP 1 -> 4 on two hosts in 2 MiB rounds: later rounds copy dst regions that earlier rounds
    filled, some by the peer's copies into this host's arena (each round's `done` orders them)."""
    from tenplex.compiler.plan import CompileOptions
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec("gpt-tiny:tp1,pp1,dp1@1x1"), ptc_from_spec("gpt-tiny:tp1,pp1,dp4@2x2")
    plan = compile_plan(src, dst, CompileOptions(max_message_bytes=1 << 20, memory_budget_bytes=2 << 20))
    assert plan.stats.rounds > 2 and any(isinstance(op, CopyOp) and op.src_side == "dst" for op in plan.ops)
    tensors, values = arange_tensors(src), arange_values(src)
    with _runtime(src, materialize_all(src, tensors), values) as rt:
        sent = rt.execute(plan, src, dst, JOB, "v0", "v1")
        assert sum(sent.values()) == plan.stats.network_bytes
        assert {h: s["direct_bytes"] for h, s in rt.host_seconds.items()} == sent
        assert check_state(dst.with_allocation(plan.allocation), tensors, rt.fetch(JOB, "v1")[0]) > 0


@pytest.mark.timeout(60)
def test_killed_agent_names_host_and_commits_nothing(case):
    src, dst, plan, _, arrays, values = case
    with _runtime(src, arrays, values, timeout=3.0) as rt:  # h0 runs on until its UCX wait for h1 times out
        victim = rt.agents["h1"].proc
        victim.kill()
        victim.join(10)
        with pytest.raises(ExecutionError, match=r"host 'h1': prepare: agent process died") as info:
            rt.execute(plan, src, dst, JOB, "v0", "v1")
        assert "nothing was committed" in str(info.value)
        assert rt.call("h0", "exists", path=f"/job/{JOB}/v1") is False
        assert rt.call("h0", "exists", path=f"/job/{JOB}/.staging-v1") is False
        a0, v0 = rt.call("h0", "fetch", job=JOB, tag="v0")
        assert a0 and all(a0[k].tobytes() == arrays[k].tobytes() for k in a0)
        assert v0 == {k: v for k, v in values.items() if k in {(p, d) for p, d in v0}}


@pytest.mark.timeout(60)
def test_bad_op_names_host_and_message_and_keeps_src(case):
    src, dst, plan, _, arrays, values = case
    local = next(m for m in plan.messages if m.src_host == m.dst_host == "h1")
    i = local.ops[0]
    op = plan.ops[i]
    assert isinstance(op, CopyOp)
    far = Box(tuple(s + 10**6 for s in op.box.start), tuple(e + 10**6 for e in op.box.stop))
    ops = list(plan.ops)
    ops[i] = attrs.evolve(op, box=far)  # outside its pieces: slicing the plan for h1 fails
    bad = attrs.evolve(plan, ops=tuple(ops))
    with _runtime(src, arrays, values, timeout=3.0) as rt:
        with pytest.raises(ExecutionError) as info:
            rt.execute(bad, src, dst, JOB, "v0", "v1")
        text = str(info.value)
        assert "before anything ran (nothing was committed)" in text, text
        assert f"message {local.id} (h1 -> h1, round {local.round}), op {i} (copy of {op.tensor!r}" in text, text
        assert "outside piece" in text, text
        _assert_nothing_committed(rt)
        _assert_src_intact(rt, arrays, values)


@pytest.mark.timeout(60)
def test_missing_agent_for_a_host_is_rejected_before_anything_runs(case):
    src, dst, plan, _, _, _ = case
    from tenplex.runtime.runtime import Runtime

    rt = Runtime({}, round_timeout=1.0)
    with pytest.raises(ExecutionError, match=r"no agent for host\(s\) \['h0', 'h1'\]"):
        rt.execute(plan, src, dst, JOB, "v0", "v1")
    with pytest.raises(ExecutionError, match=r"staging the plan failed .* on host 'h\d', which has no slice"):
        rt.stage(plan, src, dst)


@pytest.mark.timeout(60)
def test_staged_plans_execute_without_slicing(case, monkeypatch):
    """`stage` slices ahead (a central plan's two plans too) and hands the agents their slices:
    their executes slice nothing and send only the slices' ids."""
    from tenplex.compiler.central import compile_central
    from tenplex.runtime import runtime
    from tenplex.runtime.agent import slicing

    src, dst, plan, tensors, arrays, values = case
    central = compile_central(src, dst, "h0")
    with _runtime(src, arrays, values) as rt:
        rt.stage(plan, src, dst)
        rt.stage(central, src, dst)
        assert all(len(rt.agents[h].kept) == 3 for h in HOSTS)
        monkeypatch.setattr(slicing, "host_slices", lambda *a: pytest.fail("sliced again"))
        calls, call_all = [], runtime.client.call_all
        monkeypatch.setattr(runtime.client, "call_all", lambda agents, c, *a: calls.append(c) or call_all(agents, c, *a))
        rt.execute(plan, src, dst, JOB, "v0", "v1")
        rt.execute_central(central, src, dst, JOB, "v0", "v2")
        prepares = [args for c in calls for name, args in c.values() if name == "prepare"]
        assert len(prepares) == 3 * len(HOSTS) and all(args["slice"] is None for args in prepares)
        for tag, allocation in (("v1", plan.allocation), ("v2", central.scatter.allocation)):
            assert check_state(dst.with_allocation(allocation), tensors, rt.fetch(JOB, tag)[0]) > 0


@pytest.mark.timeout(60)
def test_values_another_host_holds_are_passed_on():
    """DP 1 -> 2 onto a second host: h1's value ops copy values only h0 holds (prepare, then run)."""
    from tenplex.compiler.emit.slices import host_slices
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec("gpt-tiny:tp1,pp1,dp1@1x1"), ptc_from_spec("gpt-tiny:tp1,pp1,dp2@2x1")
    plan = compile_plan(src, dst)
    assert host_slices(plan, src, dst, HOSTS)["h0"]["gives"]  # the runtime must pass them on
    tensors, values = arange_tensors(src), arange_values(src)
    with _runtime(src, materialize_all(src, tensors), values) as rt:
        rt.execute(plan, src, dst, JOB, "v0", "v1")
        got, got_values = rt.fetch(JOB, "v1")
    assert check_state(dst.with_allocation(plan.allocation), tensors, got) > 0
    copied = [op for op in plan.ops if isinstance(op, ValueOp) and op.src_partition is not None]
    assert {dst.topology.host_of(op.dst_device) for op in copied} == {"h0", "h1"}
    for op in copied:
        assert got_values[(op.dst_partition, op.dst_device)][op.name] == values[(op.src_partition, op.src_device)][op.name]
