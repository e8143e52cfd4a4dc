"""`ptc_from_json` on random edits of real PTC documents: it returns a PTC that prints back to
the same canonical JSON, or raises one ParseError that names a field (the edited one, or the one
whose reference the edit broke); nothing else (no KeyError, TypeError or ValueError)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenplex.ir import ParseError, ptc_from_json, ptc_to_json
from tests.compiler.test_verify_fuzz import edited_json
from tests.problems import problems

SECTIONS = ("document", "format", "devices", "links", "tensors", "subtensors", "partitions", "allocation")


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_edited_ptc_json_parses_or_names_the_field(data):
    src, dst = data.draw(problems(), "problem")
    root, path = data.draw(edited_json(ptc_to_json(data.draw(st.sampled_from([src, dst])))), "edit")
    try:
        ptc = ptc_from_json(root, "ptc.json")
    except ParseError as e:
        message = str(e)
        assert "\n" not in message and message.startswith("ptc.json: ")
        assert message.split(": ")[1].split("[")[0].split(".")[0] in SECTIONS, (path, message)
        return
    assert ptc_from_json(ptc_to_json(ptc), "again") == ptc
