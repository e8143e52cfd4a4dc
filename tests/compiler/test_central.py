"""The centralized baseline: gather on one host, then scatter (`compile_central`).

Over random problems: both plans verify (compile_plan checks them), running gather then scatter
reproduces the dst oracle byte for byte, the gathered state sits on the central host only, and
the baseline never moves fewer network bytes than the peer-to-peer plan.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.compiler import compile_plan
from tenplex.compiler.central import compile_central, gathered
from tenplex.ir import CompileError
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.executor import Executor, State
from tenplex.runtime.oracle import check_state
from tenplex.runtime.transport.local import LocalTransport
from tests.problems import problems


@settings(deadline=None, max_examples=60)
@given(problems(dst_complete=True), st.data())
def test_gather_then_scatter_reproduces_the_oracle(problem, data):
    src, dst = problem
    host = data.draw(st.sampled_from(src.topology.union(dst.topology).hosts))
    central = compile_central(src, dst, host)
    assert {central.mid.topology.host_of(d) for d in central.mid.allocation.devices} <= {host}
    assert not set(central.mid.allocation.devices) & {d.id for d in src.topology.union(dst.topology).devices}
    tensors = arange_tensors(src)
    values = arange_values(src)
    mid = Executor(central.gather, src, central.mid, LocalTransport()).run(State(materialize_all(src, tensors), values))
    out = Executor(central.scatter, central.mid, dst, LocalTransport()).run(mid)
    check_state(dst.with_allocation(central.scatter.allocation), tensors, out.arrays)  # raises on any difference
    assert central.network_bytes >= compile_plan(src, dst).stats.network_bytes


def test_gpt_scale_out_moves_every_byte_through_the_central_host():
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec("gpt-tiny:tp2,pp2,dp1@2x2"), ptc_from_spec("gpt-tiny:tp2,pp2,dp2@4x2")
    central, p2p = compile_central(src, dst, "h0"), compile_plan(src, dst)
    assert all("h0" in (m.src_host, m.dst_host) for m in central.gather.messages + central.scatter.messages
               if m.src_host != m.dst_host)  # fmt: skip
    assert central.network_bytes > 1.5 * p2p.stats.network_bytes


def test_unknown_central_host_is_a_compile_error():
    from tenplex.frontends.spec import ptc_from_spec

    src = ptc_from_spec("gpt-tiny:tp2,pp1,dp1@2x1")
    with pytest.raises(CompileError, match=r"central host 'nowhere' is not in the topology \(hosts: \['h0', 'h1'\]\)"):
        gathered(src, src, "nowhere")
