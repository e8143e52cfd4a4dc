"""docs/img/architecture.{json,png} show the code as it is: the committed import edges equal the
graph `docs/architecture.py` computes from the code today, and every component is placed in the
picture's rows (rerun `python docs/architecture.py` after moving code)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("grimp")
ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("architecture", ROOT / "docs" / "architecture.py")
architecture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(architecture)


def test_the_committed_picture_is_the_import_graph_of_today():
    committed = json.loads((ROOT / "docs" / "img" / "architecture.json").read_text())["edges"]
    now = architecture.edges()
    assert now == committed, (
        f"imports changed: added {[e for e in now if e not in committed]}, gone {[e for e in committed if e not in now]}; "
        "run `python docs/architecture.py` and commit docs/img/architecture.{json,png}"
    )
    assert (ROOT / "docs" / "img" / "architecture.png").stat().st_size > 10_000


def test_every_component_has_a_place_and_no_arrow_points_up():
    rows = {name: r for r, row in enumerate(architecture.GRID) for name in row}
    for a, b in architecture.edges():
        assert a in rows and b in rows, f"{a} -> {b}: place both in GRID"
        assert rows[a] <= rows[b], f"{a} (row {rows[a]}) imports {b} (row {rows[b]}): an arrow points up"


def test_components_are_named_from_module_paths():
    assert architecture.component("tenplex.runtime.agent.rounds") == "runtime.agent"
    assert architecture.component("tenplex.frameworks.dcp.read") == "frameworks.dcp"
    assert architecture.component("tenplex.compiler.passes.lower") == "compiler"
    assert architecture.component("tenplex._lazy") is None and architecture.component("torch") is None
