"""`check_state`: the one comparison of executed dst arrays with the arange oracle, message by message."""

import numpy as np
import pytest

from tenplex.compiler import compile_plan
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import arange_tensors
from tenplex.runtime.oracle import check_execution, check_state


@pytest.fixture(scope="module")
def case():
    src, dst = ptc_from_spec("gpt-tiny:tp2,pp1,dp1@1x2"), ptc_from_spec("gpt-tiny:tp1,pp2,dp1@1x2")
    plan = compile_plan(src, dst)
    state = check_execution(plan, src, dst)
    return dst.with_allocation(plan.allocation), arange_tensors(src), state.arrays


def test_the_executed_state_passes_and_counts_its_bytes(case):
    placed, tensors, got = case
    assert check_state(placed, tensors, got) == sum(a.nbytes for a in got.values())


def test_a_missing_and_an_extra_instance_are_named(case):
    placed, tensors, got = case
    key = sorted(got)[0]
    fewer = {k: a for k, a in got.items() if k != key}
    with pytest.raises(ExecutionError, match=rf"missing \[{key!r}\]".replace("(", r"\(").replace(")", r"\)")):
        check_state(placed, tensors, fewer)
    with pytest.raises(ExecutionError, match=r"extra \[\('nowhere', 9\)\]"):
        check_state(placed, tensors, {**got, ("nowhere", 9): got[key]})


def test_a_changed_byte_and_a_changed_dtype_are_named(case):
    placed, tensors, got = case
    key = max(got, key=lambda k: got[k].size)
    bad = got[key].copy()
    bad.reshape(-1).view(np.uint8)[7] ^= 1  # one bit of one element
    with pytest.raises(ExecutionError, match=rf"sub-tensor {key[0]!r} on device {key[1]} differs from the oracle \(first at"):
        check_state(placed, tensors, {**got, key: bad})
    same_bits = got[key].view(np.uint16) if got[key].dtype.itemsize == 2 else got[key].view(np.uint32)
    with pytest.raises(ExecutionError, match=rf"sub-tensor {key[0]!r} on device {key[1]} differs"):
        check_state(placed, tensors, {**got, key: same_bits})
