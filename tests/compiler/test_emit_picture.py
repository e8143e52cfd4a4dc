"""`--emit svg|png`: what the picture shows (`scene`: hosts and devices, or counts beyond 32
devices; host pairs by round, rows merged beyond MAX_ROWS), that the same plan gives the same
bytes whatever the user's matplotlib settings, and that tenplex imports without matplotlib."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tenplex.compiler import compile_plan
from tenplex.compiler.emit import to_svg
from tenplex.compiler.emit.picture import scene as scene_mod
from tenplex.compiler.emit.picture.scene import MAX_ROWS, scene
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError

matplotlib = pytest.importorskip("matplotlib")


def _case(src: str, dst: str):
    s, d = ptc_from_spec(src), ptc_from_spec(dst)
    return compile_plan(s, d), s, d


@pytest.fixture(scope="module")
def small():
    return _case("gpt-tiny:tp2@1x2", "gpt-tiny:tp4@2x2")


@pytest.fixture(scope="module")
def large():  # 64 devices on 16 hosts: more devices than drawn one by one, more pairs than rows
    return _case("gpt-tiny:tp2,dp8@4x4", "gpt-tiny:tp2,dp32@16x4")


def texts(svg: str) -> list[str]:
    """The picture's texts: matplotlib writes each one as a comment before its glyphs."""
    return re.findall(r"<!-- (.*?) -->", svg)


def test_small_scene_draws_every_device_with_its_role(small):
    s = scene(*small)
    assert s.per_device and [h.name for h in s.hosts] == ["h0", "h1"]
    assert [(d.id, d.role, d.label) for h in s.hosts for d in h.devices] == [
        (0, "both", "pp0-tp0"), (1, "both", "pp0-tp1"), (2, "dst", "pp0-tp2"), (3, "dst", "pp0-tp3")]  # fmt: skip
    assert [(p.src_host, p.dst_host) for p in s.pairs] == [("h0", "h1")]
    assert [r.label for r in s.rows] == ["h0 (same host)", "h0 → h1", "h1 (same host)"]
    assert s.rounds == small[0].stats.rounds


def test_large_scene_counts_devices_and_merges_rows(large):
    plan, src, dst = large
    s = scene(plan, src, dst)
    assert not s.per_device and len(s.hosts) == 16
    assert len(s.rows) <= MAX_ROWS and s.rows[-1].merged and s.rows[-1].label.startswith("+")
    assert sum(r.total.bytes for r in s.rows) == sum(m.bytes for m in plan.messages)
    assert sum(c.messages for r in s.rows for c in r.cells) == len(plan.messages)


@pytest.mark.parametrize(
    "limit, per_device", [pytest.param(64, True, id="at_the_limit"), pytest.param(63, False, id="beyond")]
)
def test_devices_are_drawn_one_by_one_up_to_the_limit(large, monkeypatch, limit, per_device):
    monkeypatch.setattr(scene_mod, "MAX_DEVICES", limit)
    monkeypatch.setattr(scene_mod, "MAX_DEVICES_PER_HOST", 8)
    assert scene(*large).per_device is per_device


def test_svg_shows_hosts_devices_messages_rounds_and_legend(small):
    shown = texts(to_svg(*small))
    assert {
        "h0",
        "h1",
        "d0",
        "d3",
        "legend",
        "messages between hosts (width by bytes)",
        "messages within a host",
    } <= set(shown)
    assert "h0 → h1" in shown and "h0 (same host)" in shown
    assert (
        any(t.startswith("same host: ") for t in shown)
        and "round (rounds run one after another; the messages of a round are independent)" in shown
    )
    assert "tenplex plan: 4 devices on 2 hosts" in shown


def test_svg_is_deterministic_and_undated(small):
    first, second = to_svg(*small), to_svg(*small)
    assert first == second
    assert "<dc:date>" not in first and "Matplotlib v" not in first


def test_user_settings_neither_change_the_picture_nor_are_changed(small):
    plain = to_svg(*small)
    with matplotlib.rc_context(
        {"lines.linewidth": 7, "font.size": 20, "svg.hashsalt": None, "axes.facecolor": "black"}
    ):
        assert to_svg(*small) == plain
        assert matplotlib.rcParams["lines.linewidth"] == 7 and matplotlib.rcParams["svg.hashsalt"] is None


def test_png_is_a_png_and_deterministic(small):
    from tenplex.compiler.emit import to_png

    first = to_png(*small)
    assert first.startswith(b"\x89PNG\r\n\x1a\n") and first == to_png(*small)


def test_large_plan_draws_without_device_boxes(large):
    shown = texts(to_svg(*large))
    assert "tenplex plan: 64 devices on 16 hosts" in shown
    assert "d0-d3" in shown and "d5" not in shown  # counts, not one box per device
    assert any(t.startswith("+") and t.endswith("network pairs") for t in shown)


def test_without_matplotlib_the_picture_is_a_one_line_error(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for name in [m for m in sys.modules if m.startswith("tenplex.compiler.emit.picture.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(TenplexError, match=r"^--emit svg needs matplotlib.*pip install 'tenplex\[plots\]'$"):
        to_svg(*small)


def test_tenplex_imports_without_matplotlib():
    code = "import sys, tenplex.cli.app, tenplex.compiler.emit; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_a_plan_without_messages_still_draws(small):
    import attrs

    plan, src, dst = small
    quiet = attrs.evolve(plan, messages=(), stats=attrs.evolve(plan.stats, rounds=0))
    s = scene(quiet, src, dst)
    assert s.rows == () and s.pairs == () and s.rounds == 0
    assert "tenplex plan: 4 devices on 2 hosts" in texts(to_svg(quiet, src, dst))
