"""`tenplex agent` processes driven by `Runtime.connect`: on this node (shared memory) and on
emulated hosts in network namespaces (UCX over TCP), peer-to-peer and centralized.

Every test has a hard timeout; the fleet's context manager always stops (or kills) the agents.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tenplex.compiler import compile_plan
from tenplex.compiler.central import compile_central
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent.fleet import AgentFleet
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.netns import EmulatedHosts, netns_unavailable_reason
from tenplex.runtime.oracle import check_state
from tenplex.runtime.runtime import Runtime
from tenplex.runtime.transport.ucx import ucx_available

_REASON = ucx_available()
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.skipif(_REASON is not None, reason=f"ucxx cannot be imported: {_REASON}"),
]
JOB = "j"


def _case(src_spec: str, dst_spec: str):
    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    tensors = arange_tensors(src)
    values = arange_values(src)
    return src, dst, tensors, values


def _assert_oracle(rt: Runtime, tag: str, dst, allocation, tensors) -> None:
    assert check_state(dst.with_allocation(allocation), tensors, rt.fetch(JOB, tag)[0]) > 0


@pytest.mark.timeout(90)
def test_agents_on_one_node_share_memory_and_keep_state_between_runtimes():
    src, dst, tensors, values = _case("gpt-tiny:tp2,pp1,dp1@2x1", "gpt-tiny:tp1,pp2,dp1@2x1")
    plan = compile_plan(src, dst)
    with AgentFleet(["h0", "h1"], rest=True) as fleet:
        with Runtime.connect(fleet.controls) as rt:
            assert rt.links == {"h0": {"h1": "address"}, "h1": {"h0": "address"}}
            rt.load(JOB, "v0", src, materialize_all(src, tensors), values)
            rt.execute(plan, src, dst, JOB, "v0", "v1")
            sid = rt.agents["h0"].slice_id
        # the runtime is gone; the agents and their stores are not (its slice ids are)
        with Runtime.connect(fleet.controls) as rt:
            assert rt.exists(JOB, "v1") == {"h0": True, "h1": True}
            with pytest.raises(ExecutionError, match=f"slice id '{sid}' was not sent to agent 'h0'"):
                rt.call("h0", "prepare", job=JOB, src_tag="v0", dst_tag="v2", slice_id=sid)
            _assert_oracle(rt, "v1", dst, plan.allocation, tensors)
            # the store is readable over REST while the agent runs
            url = fleet.rest_urls["h0"] + "/list?path=/job/j/v1"
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200 and json.loads(r.read()) == [".manifest", "0"]


@pytest.mark.timeout(90)
def test_killed_agent_is_named_and_the_others_keep_src_and_drop_staging():
    src, dst, tensors, values = _case("gpt-tiny:tp2,pp1,dp1@2x1", "gpt-tiny:tp1,pp1,dp2@2x1")
    plan = compile_plan(src, dst)
    with AgentFleet(["h0", "h1"], timeout=5.0) as fleet:
        with Runtime.connect(fleet.controls, round_timeout=20.0) as rt:
            rt.load(JOB, "v0", src, materialize_all(src, tensors), values)
            fleet.kill("h1")
            with pytest.raises(ExecutionError, match=r"host 'h1': .*agent process died \(connection lost\)"):
                rt.execute(plan, src, dst, JOB, "v0", "v1")
        with Runtime.connect({"h0": fleet.controls["h0"]}) as rt:
            assert rt.exists(JOB, "v0") == {"h0": True}
            assert rt.exists(JOB, ".staging-v1") == {"h0": False}
            assert rt.exists(JOB, "v1") == {"h0": False}


@pytest.mark.timeout(60)
def test_connect_rejects_an_agent_with_another_name_and_a_missing_socket(tmp_path):
    wrong = r"agents answer with other names than asked: \{'h7': 'h0'\}"
    with AgentFleet(["h0"]) as fleet, pytest.raises(ExecutionError, match=wrong):
        Runtime.connect({"h7": fleet.controls["h0"]})
    with pytest.raises(ExecutionError, match=r"no agent answers at .*nobody\.sock"):
        Runtime.connect({"h0": str(tmp_path / "nobody.sock")}, start_timeout=0.5)


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(netns_unavailable_reason() is not None, reason=f"{netns_unavailable_reason()}")
def test_emulated_hosts_p2p_and_central_over_tcp():
    src, dst, tensors, values = _case("gpt-tiny:tp2,pp2,dp1@2x2", "gpt-tiny:tp2,pp2,dp2@4x2")
    plan, central = compile_plan(src, dst), compile_central(src, dst, "h0")
    names = ["h0", "h1", "h2", "h3"]
    with EmulatedHosts(4, rate="1gbit") as hosts, AgentFleet(names, hosts=hosts) as fleet, \
            Runtime.connect(fleet.controls) as rt:  # fmt: skip
        assert all(mode == "tcp" for links in rt.links.values() for mode in links.values())
        assert sorted(rt.links) == names and all(len(v) == 3 for v in rt.links.values())
        rt.load(JOB, "v0", src, materialize_all(src, tensors), values)
        before = rt.memory(reset_peak=True)
        sent = rt.execute(plan, src, dst, JOB, "v0", "p2p")
        after = rt.memory()
        assert all(0 < before[h]["rss"] <= after[h]["peak"] for h in names)
        assert sum(sent.values()) == plan.stats.network_bytes
        _assert_oracle(rt, "p2p", dst, plan.allocation, tensors)
        sent = rt.execute_central(central, src, dst, JOB, "v0", "central")
        assert sum(sent.values()) == central.network_bytes
        _assert_oracle(rt, "central", dst, central.scatter.allocation, tensors)
        assert rt.exists(JOB, ".central-central") == dict.fromkeys(names, False)
        assert {"gather rounds", "scatter rounds"} <= set(rt.phases)
        # TP 2 -> 4: the senders pack many parts (staged sends) and copy locally over TCP
        tp = ptc_from_spec("gpt-tiny:tp4,pp2,dp1@4x2")
        plan = compile_plan(src, tp)
        sent = rt.execute(plan, src, tp, JOB, "v0", "tp4")
        assert sum(sent.values()) == plan.stats.network_bytes
        assert all(rt.host_seconds[h]["pack"] > 0 and rt.host_seconds[h]["local"] > 0 for h in ("h0", "h1"))
        _assert_oracle(rt, "tp4", tp, plan.allocation, tensors)


def test_control_addresses_and_tokens():
    import socket

    from tenplex.runtime.agent.channel import listen, parse_address

    assert parse_address("/tmp/a.sock") == (socket.AF_UNIX, "/tmp/a.sock")
    assert parse_address("10.0.0.1:7000") == (socket.AF_INET, ("10.0.0.1", 7000))
    assert parse_address("[::1]:7000") == (socket.AF_INET6, ("::1", 7000))
    with pytest.raises(ExecutionError, match=r"TCP needs a token \(--token-file or \$TENPLEX_AGENT_TOKEN\)"):
        listen("127.0.0.1:0", None)
    with pytest.raises(ExecutionError, match="control address 'host:port': expected a socket path or HOST:PORT"):
        parse_address("host:port")


@pytest.mark.timeout(60)
def test_tcp_control_with_a_token_and_a_wrong_token(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "token").write_text("s3cret\n")
    argv = [sys.executable, "-m", "tenplex.cli", "agent", "--name", "h0", "--control", f"127.0.0.1:{port}",
            "--token-file", str(tmp_path / "token")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"tenplex agent h0: control 127.0.0.1:{port}")
        with pytest.raises(ExecutionError, match=rf"the agent at 127.0.0.1:{port} rejected the connection \(wrong token\?\)"):
            Runtime.connect({"h0": f"127.0.0.1:{port}"}, token="wrong", start_timeout=5)
        with Runtime.connect({"h0": f"127.0.0.1:{port}"}, token="s3cret") as rt:
            assert rt.exists(JOB, "v0") == {"h0": False}
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(netns_unavailable_reason() is not None, reason=f"{netns_unavailable_reason()}")
def test_run_hosts_compares_p2p_with_central_and_leaves_no_tags():
    from demo.hosts import hosts_ok, run_hosts

    rows, skipped = run_hosts("gpt-tiny", [("pp", "tp1,pp2,dp1@2x1", "tp1,pp4,dp1@4x1")])
    assert skipped == "" and hosts_ok(rows, skipped), rows
    (row,) = rows
    assert row["equal"] and row["p2p_network_bytes"] < row["central_network_bytes"]
    assert row["checked_bytes"] > 0 and row["bound_s"] > 0 and row["p2p_s"] > 0 and row["central_s"] > 0
    assert set(row["p2p_phases"]) == {"prepare", "rounds", "commit"}
