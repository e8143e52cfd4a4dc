"""Run a plan in-process on `arange`-filled sources and compare with the dst oracle."""

from __future__ import annotations

import numpy as np

from tenplex.compiler.plan import Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize, materialize_all
from tenplex.runtime.executor import Executor, State
from tenplex.runtime.transport.local import LocalTransport


def check_execution(plan: Plan, src: PTC, dst: PTC) -> State:
    """Execute `plan` from arange sources; raise ExecutionError on the first byte that differs
    from the dst oracle (the same global tensors cut by dst's layout under the plan's allocation)."""

    tensors = arange_tensors(src)
    state = Executor(plan, src, dst, LocalTransport()).run(State(materialize_all(src, tensors), arange_values(src)))
    check_state(dst.with_allocation(plan.allocation), tensors, state.arrays)
    return state


def check_state(placed: PTC, tensors: dict[str, np.ndarray], got: dict[tuple[str, int], np.ndarray]) -> int:
    """Compare arrays `got` ((sub-tensor, device) -> array, from any executor or agents) with the
    dst oracle of `placed` (dst under the plan's allocation) cut from the global `tensors`;
    returns the bytes compared. Raises ExecutionError naming the first instance that differs
    (dtype, shape or a byte), or the instances that are missing or extra."""
    want_keys = {(s.id, d) for s in placed.subtensors for d in placed.devices_of_subtensor(s.id)}
    if want_keys != got.keys():
        raise ExecutionError(f"instances differ from the dst oracle's: missing {sorted(want_keys - got.keys())[:4]}, "
                             f"extra {sorted(got.keys() - want_keys)[:4]}")  # fmt: skip
    n = 0
    for s in placed.subtensors:
        want = materialize(placed, tensors, s)
        for d in placed.devices_of_subtensor(s.id):
            a = got[(s.id, d)]
            if a.dtype != want.dtype or a.shape != want.shape or a.tobytes() != want.tobytes():
                bad = np.argwhere(a != want)[:1] if a.shape == want.shape else f"shape {a.shape}"
                raise ExecutionError(f"sub-tensor {s.id!r} on device {d} differs from the oracle (first at {bad})")
            n += want.nbytes
    return n
