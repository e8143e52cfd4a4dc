"""A collective call that loses a host ends at once: the runtime tells the agents still working to
give up (`client._cancel`), and their transport waits fail within a poll naming the failed host,
instead of waiting for its messages until their own UCX / cma timeout (30 s here, on purpose).
A cancel that comes after its command finished changes nothing.

Real agent processes on both transports; the bound on seconds is generous for a loaded 2-core
machine (the waits it replaces take 30 s)."""

from __future__ import annotations

import re
import time

import pytest

from tenplex.compiler.compile import compile_plan
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_state
from tenplex.runtime.runtime import Runtime
from tenplex.runtime.transport import cma
from tenplex.runtime.transport.ucx import ucx_available

pytestmark = pytest.mark.multiprocess
TRANSPORTS = [
    pytest.param("ucx", marks=pytest.mark.skipif(ucx_available() is not None, reason=f"no ucxx: {ucx_available()}")),
    pytest.param("cma", marks=pytest.mark.skipif(cma.unusable() is not None, reason=f"no cma: {cma.unusable()}")),
]
PEER_TIMEOUT_S = 30.0  # the agents' own transport timeout: what a survivor waited before
FAST_S = 10.0


@pytest.fixture(scope="module")
def case():
    src, dst = ptc_from_spec("gpt-tiny:tp2,pp1,dp1@2x1"), ptc_from_spec("gpt-tiny:tp1,pp1,dp2@2x1")
    tensors = arange_tensors(src)
    return src, dst, compile_plan(src, dst), tensors, materialize_all(src, tensors), arange_values(src)


def _started(case, transport: str) -> Runtime:
    src, _, _, _, arrays, values = case
    rt = Runtime.local(["h0", "h1"], timeout=PEER_TIMEOUT_S, round_timeout=60.0, start_timeout=60.0, transport=transport)
    try:
        rt.load("j", "v0", src, arrays, values)
    except BaseException:
        rt.close()
        raise
    return rt


def _fails_fast_naming(rt: Runtime, case, pattern: str) -> str:
    src, dst, plan, *_ = case
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=pattern) as info:
        rt.execute(plan, src, dst, "j", "v0", "v1")
    took = time.monotonic() - t0
    text = str(info.value)
    assert took < FAST_S, f"{took:.1f} s: {text}"
    assert "nothing was committed" in text, text
    # the survivor gave up on h1: told by the runtime, or (cma) its socket to the dead h1 broke first
    assert re.search(r"host 'h0': prepare failed: .*(cancelled: host 'h1' failed|peer 'h1')", text), text
    return text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_dead_agent_ends_the_execute_at_once_and_the_survivor_aborts(case, transport):
    _, _, _, _, arrays, _ = case
    with _started(case, transport) as rt:
        rt.agents["h1"].proc.kill()
        rt.agents["h1"].proc.join(10)
        text = _fails_fast_naming(rt, case, r"host 'h1': prepare: agent process died")
        assert text.index("host 'h1'") < text.index("host 'h0'"), text  # the cause first, then who gave up on it
        assert rt.call("h0", "exists", path="/job/j/.staging-v1") is False
        assert rt.call("h0", "exists", path="/job/j/v1") is False
        a0, _ = rt.call("h0", "fetch", job="j", tag="v0")
        assert a0 and all(a0[k].tobytes() == arrays[k].tobytes() for k in a0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_reply_ends_the_execute_at_once_and_a_late_cancel_changes_nothing(case, transport):
    src, dst, plan, tensors, arrays, values = case
    with _started(case, transport) as rt:
        rt.call("h1", "delete_tag", job="j", tag="v0")  # h1's prepare fails at once; h0 waits for h1's parts
        text = _fails_fast_naming(rt, case, r"host 'h1': prepare failed: src array /job/j/v0/\S+ is missing")
        assert "cancelled: host 'h1' failed" in text, text  # h1 lives: only the runtime's cancel ends h0's wait
        assert rt.exists("j", ".staging-v1") == {"h0": False, "h1": False}
        for agent in rt.agents.values():  # cancels after their command finished: dropped, no reply
            agent.channel.send({"cancel": "host 'h9' failed"}, 1.0, 1.0)
        assert rt.call("h0", "name") == "h0" and rt.call("h1", "name") == "h1"  # each call gets its own reply
        rt.load("j", "v0", src, arrays, values)
        for agent in rt.agents.values():  # a cancel while idle does not cancel the next command
            agent.channel.send({"cancel": "host 'h9' failed"}, 1.0, 1.0)
        rt.execute(plan, src, dst, "j", "v0", "v1")
        assert check_state(dst.with_allocation(plan.allocation), tensors, rt.fetch("j", "v1")[0]) > 0
