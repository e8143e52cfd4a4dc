"""Property tests of `compile_plan` over random reconfiguration problems (tests/problems.py).

For every problem and options: the plan verifies, executing it reproduces the arange oracle
byte for byte (values included), its network bytes equal the lower bound, compiling is
deterministic and independent of input order, plan JSON round-trips, and placing ranks never
costs network bytes. The reference baseline verifies too and never beats the bound; problems
whose src lacks data fail with a CompileError naming the tensor.
"""

import json

import attrs
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tenplex.compiler import CopyOp, check_plan, compile_plan, dumps_plan, network_lower_bound, plan_from_json
from tenplex.ir import CompileError, LinkClass, dumps
from tenplex.runtime.oracle import check_execution
from tests.problems import bad_problems, compile_options, problems, shuffled


def _note(src, dst) -> None:
    note(f"src:\n{dumps(src)}dst:\n{dumps(dst)}")


def _expected_values(src, dst, plan) -> dict:
    """(dst partition, device) -> values after the plan: literals, or src's agreed literal."""
    src_literal = {n: v.value for p in src.partitions for n, v in p.values}
    return {
        (p.id, d): {n: src_literal[n] if v.value is None and v.policy == "replicated" else v.value for n, v in p.values}
        for p in dst.partitions
        for d in plan.allocation.devices_of(p.id)
        if p.values
    }


@settings(deadline=None)
@given(problems(), compile_options())
def test_plan_verifies_and_reproduces_the_oracle(problem, options):
    src, dst = problem
    _note(src, dst)
    plan = compile_plan(src, dst, options)
    check_plan(plan, src, dst)
    state = check_execution(plan, src, dst)
    assert {k: v for k, v in state.values.items() if v} == _expected_values(src, dst, plan)


@settings(deadline=None)
@given(problems(), compile_options())
def test_network_bytes_equal_the_lower_bound(problem, options):
    src, dst = problem
    _note(src, dst)
    plan = compile_plan(src, dst, options)
    bound = network_lower_bound(src, dst, plan.allocation)
    assert plan.stats.network_bytes == bound == plan.stats.network_lower_bound_bytes
    assert plan.stats.predicted_seconds >= plan.stats.lower_bound_seconds * (1 - 1e-9)
    for m in plan.messages:  # a same-device copy is a view, never cut: alone in its message
        view = len(m.ops) == 1 and plan.ops[m.ops[0]].src_device == plan.ops[m.ops[0]].dst_device
        assert m.bytes <= options.max_message_bytes or view, m
    topology = src.topology.union(dst.topology)
    forwards = [op for op in plan.ops if isinstance(op, CopyOp) and op.src_side == "dst"]
    assert all(topology.link(op.src_device, op.dst_device) is not LinkClass.NETWORK for op in forwards)


@settings(deadline=None)
@given(problems(), compile_options())
def test_place_ranks_never_moves_more_network_bytes(problem, options):
    src, dst = problem
    _note(src, dst)
    placed = compile_plan(src, dst, attrs.evolve(options, place_ranks=True))
    kept = compile_plan(src, dst, attrs.evolve(options, place_ranks=False))
    assert kept.allocation == dst.allocation
    assert placed.stats.network_bytes <= kept.stats.network_bytes


@settings(deadline=None)
@given(problems(), compile_options(), st.data())
def test_compile_is_deterministic_and_order_independent(problem, options, data):
    src, dst = problem
    _note(src, dst)
    text = dumps_plan(compile_plan(src, dst, options))
    assert dumps_plan(compile_plan(src, dst, options)) == text
    src2, dst2 = data.draw(shuffled(src, replicas=True)), data.draw(shuffled(dst))
    assert dumps_plan(compile_plan(src2, dst2, options)) == text


@settings(deadline=None)
@given(problems(), compile_options())
def test_plan_json_round_trips(problem, options):
    src, dst = problem
    _note(src, dst)
    text = dumps_plan(compile_plan(src, dst, options))
    again = plan_from_json(json.loads(text))
    assert dumps_plan(again) == text
    check_plan(again, src, dst)


@settings(deadline=None)
@given(problems(), compile_options(baseline="reference"))
def test_reference_baseline_verifies_and_moves_at_least_the_bound(problem, options):
    src, dst = problem
    _note(src, dst)
    plan = compile_plan(src, dst, options)
    check_plan(plan, src, dst)
    check_execution(plan, src, dst)
    assert plan.allocation == dst.allocation
    assert plan.stats.network_bytes >= network_lower_bound(src, dst) == plan.stats.network_lower_bound_bytes


@settings(deadline=None)
@given(bad_problems(), compile_options())
def test_src_lacking_a_region_is_a_compile_error_naming_the_tensor(bad, options):
    src, dst, tensor = bad
    _note(src, dst)
    with pytest.raises(CompileError, match=f"tensor '{tensor}'"):
        compile_plan(src, dst, options)
