"""Run a plan in-process on `arange`-filled sources and compare with the dst oracle."""

from __future__ import annotations

import numpy as np

from tenplex.compiler.plan import Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import arange_tensors, materialize_all
from tenplex.runtime.executor import Executor, State
from tenplex.runtime.transport.local import LocalTransport


def check_execution(plan: Plan, src: PTC, dst: PTC) -> State:
    """Execute `plan` from arange sources; raise ExecutionError on the first byte that differs
    from the dst oracle (the same global tensors cut by dst's layout under the plan's allocation)."""

    tensors = arange_tensors(src)
    values = {(p.id, d): {n: v.value if v.value is not None else f"{n}@{p.id}" for n, v in p.values}
              for p in src.partitions for d in src.allocation.devices_of(p.id)}  # fmt: skip
    state = Executor(plan, src, dst, LocalTransport()).run(State(materialize_all(src, tensors), values))
    want = materialize_all(dst.with_allocation(plan.allocation), tensors)
    if want.keys() != state.arrays.keys():
        raise ExecutionError(f"executed instances {sorted(state.arrays)[:4]} differ from dst instances {sorted(want)[:4]}")
    for key, expected in want.items():
        got = state.arrays[key]
        if got.tobytes() != expected.tobytes():
            bad = np.argwhere(got.view(np.uint8) != expected.view(np.uint8))[:1] if got.shape == expected.shape else "shape"
            raise ExecutionError(f"sub-tensor {key[0]!r} on device {key[1]} differs from the oracle (first at {bad})")
    return state
