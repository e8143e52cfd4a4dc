"""Fuzzing the plan checker and the plan parser with broken real plans.

Every example compiles a random problem (tests/problems.py), breaks the plan
(tests/compiler/plan_mutations.py) and asks `check_plan`. The property: the checker raises
`PlanVerifyError`, or the plan is right by an independent judge (tests/compiler/plan_judge.py:
provenance execution round by round, strict values, recounted messages and stats) *and* by the
project's `arange` oracle. Nothing but a PlanVerifyError may escape the checker (no
IndexError, KeyError or TypeError from a malformed op).

`plan_from_json` gets random edits of a real plan's JSON: it returns a Plan (which then meets
the same property) or raises a ParseError that names the field; nothing else.
"""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

from tenplex.compiler import check_plan, compile_plan, dumps_plan, plan_from_json, plan_to_json
from tenplex.compiler.verify import accepted_by_columns, check_plan_exact
from tenplex.ir import ParseError, PlanVerifyError, dumps
from tenplex.runtime.oracle import check_execution
from tests.compiler.plan_judge import wrongs
from tests.compiler.plan_mutations import mutated
from tests.problems import compile_options, problems

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def _compiled(data):
    src, dst = data.draw(problems(), "problem")
    plan = compile_plan(src, dst, data.draw(compile_options(), "options"))
    assume(plan.ops or data.draw(st.integers(0, 9), "keep an empty plan") == 0)  # few empty plans
    note(f"src:\n{dumps(src)}dst:\n{dumps(dst)}")
    return plan, src, dst


def _judged(plan, src, dst, labels) -> None:
    """check_plan refuses `plan` with a PlanVerifyError, or `plan` is right. The vectorized
    checks accept only plans that the exact checker verifies too."""
    columns = accepted_by_columns(plan, src, dst)
    try:
        check_plan(plan, src, dst)
    except PlanVerifyError as e:
        assert not columns, f"the columns accepted a plan that check_plan refuses ({labels}): {e}"
        event(f"refused: {re.sub(r'[0-9]+', 'N', str(e).split(':')[0])[:60]}")
        return
    check_plan_exact(plan, src, dst)  # raises if the columns accepted what the exact checker refuses
    event(f"verified by {'the columns' if columns else 'the exact checker alone'}")
    event(f"verified after {'+'.join(labels)}")
    reasons = wrongs(plan, src, dst)
    assert not reasons, f"check_plan verified a wrong plan ({labels}): {reasons}\n{dumps_plan(plan)}"
    check_execution(plan, src, dst)


@FUZZ
@given(st.data())
def test_compiled_plans_are_right_by_the_judge(data):
    plan, src, dst = _compiled(data)
    assert wrongs(plan, src, dst) == []
    assert accepted_by_columns(plan, src, dst)  # compiled plans take the fast path


@FUZZ
@given(st.data())
def test_no_broken_plan_verifies(data):
    plan, src, dst = _compiled(data)
    broken, labels = data.draw(mutated(plan, src, dst), "mutation")
    if broken is None:
        event("refused by the IR")
        return
    _judged(broken, src, dst, labels)


@pytest.mark.slow
@settings(FUZZ, max_examples=1500)
@given(st.data())
def test_no_broken_plan_verifies_deep(data):
    test_no_broken_plan_verifies.hypothesis.inner_test(data)


# -- plan JSON -------------------------------------------------------------------------------

json_leaves = (st.none() | st.booleans() | st.integers(-3, 9) | st.sampled_from([2**63, -(2**70), 10**30])
               | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["", "x", "\x00", "order", "copy", "h0"]))  # fmt: skip
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=2), inner, max_size=2), max_leaves=4)


def _paths(node, at=()):
    yield at
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, child in children:
        yield from _paths(child, at + (k,))


@st.composite
def edited_json(draw, root: dict) -> tuple[dict, tuple]:
    """`root` with one node replaced, deleted, duplicated or given an unknown key."""
    root = copy.deepcopy(root)
    path = draw(st.sampled_from(list(_paths(root))[1:]))
    parent = root
    for k in path[:-1]:
        parent = parent[k]
    key, node = path[-1], parent[path[-1]]
    how = draw(st.sampled_from(["replace", "delete", "duplicate", "unknown_key", "retype"]))
    if how == "delete":
        del parent[key]
    elif how == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(node))
    elif how == "unknown_key" and isinstance(node, dict):
        node["bogus"] = draw(json_values)
    elif how == "retype":
        parent[key] = str(node) if not isinstance(node, str) else [node]
    else:
        parent[key] = draw(json_values)
    return root, path


@FUZZ
@given(st.data())
def test_plan_from_json_refuses_malformed_plans_naming_the_field(data):
    plan, src, dst = _compiled(data)
    root, path = data.draw(edited_json(plan_to_json(plan)), "edit")
    try:
        again = plan_from_json(root)
    except ParseError as e:
        message = str(e)
        assert "\n" not in message and message.startswith("<plan>: ")
        named = {str(path[0]), "document"}
        if path[:1] == ("ops",) and len(path) == 2:  # an op deleted or duplicated: the edges' op ids no longer fit
            named.add("edges")
        assert message.split(": ")[1].split("[")[0].split(".")[0] in named, (path, message)
        event("parse error")
        return
    _judged(again, src, dst, [f"json edit at {path[:2]}"])


@pytest.mark.slow
@settings(FUZZ, max_examples=1500)
@given(st.data())
def test_plan_from_json_refuses_malformed_plans_deep(data):
    test_plan_from_json_refuses_malformed_plans_naming_the_field.hypothesis.inner_test(data)
