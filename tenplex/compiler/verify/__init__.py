"""`check_plan`: prove that a plan turns the src state into the dst state.

Checked, for the dst PTC under the plan's allocation:
- the allocation keeps dst's partitions and replica counts on dst's devices;
- every copy reads a region its source holds: a src piece on a device holding it, or (forward,
  `src_side="dst"`) a dst piece that an order-edge predecessor wrote in an earlier round, and
  writes inside its dst piece of the same tensor on a device holding that piece; its box has
  the tensor's ndim, and src and dst agree on the tensor's shape and dtype;
- exact cover: each dst piece on each device is written by pairwise-disjoint copies whose
  volumes add up to the piece's volume; every local region outside the pieces is filled exactly
  once with the sub-tensor's fill value;
- each value of each dst partition on each device is set once, from a src partition that has
  it (inherited values) or to the dst literal (equal as JSON, types included: 1 is not 1.0);
- messages: every copy is in exactly one message, between its devices' hosts, with its bytes;
  a message exceeds `max_message_bytes` only when it holds one same-device copy or one
  element; network bytes per host and round stay within the memory budget; every stat,
  predicted seconds included, is the one recomputed from the ops.

Raises PlanVerifyError naming tensor, sub-tensor, device and boxes, and nothing else: an
inconsistent input (e.g. src and dst placing one device on two hosts) is reported the same way.
Never skips a check.

Two checkers share these checks: `verify.columns.accepts` runs them on numpy columns of the
copies and messages (a large plan in a fraction of the time) and only ever accepts; when it
cannot show a check, `check_plan_exact` (`_Checker`, one op and message at a time) decides and
names the first broken thing, so the errors are the same as with the exact checker alone.
"""

from __future__ import annotations

from tenplex.compiler.nogc import without_gc
from tenplex.compiler.plan import Plan
from tenplex.compiler.verify.columns import accepts
from tenplex.compiler.verify.exact import _Checker, _with_allocation, check_plan_exact, same_json
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC

__all__ = ["accepted_by_columns", "check_plan", "check_plan_exact", "same_json"]


@without_gc
def check_plan(plan: Plan, src: PTC, dst: PTC) -> None:
    if not accepted_by_columns(plan, src, dst):
        check_plan_exact(plan, src, dst)


def accepted_by_columns(plan: Plan, src: PTC, dst: PTC) -> bool:
    """True when the vectorized checks (`verify.columns`) show that every check holds; False
    when one fails or cannot be shown there."""
    try:
        checker = _Checker(plan, src, _with_allocation(dst, plan.allocation))
    except TenplexError:
        return False
    return accepts(checker)
