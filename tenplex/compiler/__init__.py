"""The plan compiler: pure functions from two PTCs to a verified, minimal plan."""

from tenplex.compiler.compile import compile_plan
from tenplex.compiler.cost import network_lower_bound
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import (
    CompileOptions,
    Message,
    Plan,
    Stats,
    dumps_plan,
    load_plan,
    plan_from_json,
    plan_to_json,
)
from tenplex.compiler.verify import check_plan

__all__ = [
    "CompileOptions", "CopyOp", "FillOp", "Message", "Plan", "Stats", "ValueOp", "check_plan",
    "compile_plan", "dumps_plan", "load_plan", "network_lower_bound", "plan_from_json", "plan_to_json",
]  # fmt: skip
