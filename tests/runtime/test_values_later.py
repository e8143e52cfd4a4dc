"""Value ops whose src value another host reads get it with the commit (`Agent.run`'s `later`,
`Agent.commit`'s `values`), so no host waits for another before its rounds: in one process, an
agent whose slice needs no peer."""

from __future__ import annotations

import pytest

from tenplex.compiler import compile_plan
from tenplex.compiler.emit.slices import host_slices
from tenplex.compiler.ops import ValueOp
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent.agent import Agent
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.store.layout import array_path


def test_a_waiting_value_op_holds_the_commit_until_its_value_comes_with_it():
    src = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp2,pp1,dp1@1x2")
    dst = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp1,pp1,dp2@1x2")
    plan = compile_plan(src, dst)
    op = next(i for i, o in enumerate(plan.ops) if isinstance(o, ValueOp) and o.src_partition is not None)
    o = plan.ops[op]
    agent = Agent("h0")
    try:
        agent.load("j", "a", materialize_all(src, arange_tensors(src)), arange_values(src))
        agent.prepare("j", "a", "b", slice=host_slices(plan, src, dst, ["h0"])["h0"])
        with pytest.raises(ExecutionError, match=r"before its rounds ran \(0 of 1\)"):
            agent.commit("j", "b")
        st = dst.with_allocation(plan.allocation).subtensors[0]
        leaf = array_path("j", ".staging-b", dst.with_allocation(plan.allocation).devices_of_subtensor(st.id)[0], st.id)
        assert not agent.store.exists(leaf)  # the dst arrays become store leaves in `run` (Execution.adopt)
        agent.run(later=[op])  # as if another host read its src value
        assert agent.store.exists(leaf)
        with pytest.raises(ExecutionError, match=rf"value ops on 'h0': \[\] wait for no value, \[{op}\] got none"):
            agent.commit("j", "b")
        with pytest.raises(ExecutionError, match=rf"\[{op + 1}\] wait for no value, \[\] got none"):
            agent.commit("j", "b", values={op: 1, op + 1: 0})
        assert not agent.store.exists("/job/j/b") and agent.store.exists("/job/j/.staging-b")  # nothing committed
        agent.commit("j", "b", values={op: {"late": 1}})
        assert agent.store.get(f"/job/j/b/{o.dst_device}/.values/{o.dst_partition}/{o.name}") == {"late": 1}
    finally:
        agent.stop()
