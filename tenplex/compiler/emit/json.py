"""The plan as `tenplex.plan/1` JSON: the canonical text of `dumps_plan` (byte-identical for
identical inputs), which `load_plan` reads back."""

from __future__ import annotations

from tenplex.compiler.plan import Plan, dumps_plan


def to_json(plan: Plan) -> str:
    return dumps_plan(plan)
