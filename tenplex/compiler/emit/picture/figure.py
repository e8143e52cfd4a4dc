"""The figure: a title, the hosts panel with the legend and the plan's numbers beside it, and
the rounds panel below; laid out in fixed inches (no layout engine), saved deterministically."""

from __future__ import annotations

import io

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from tenplex.compiler.emit.fmt import human_bytes
from tenplex.compiler.emit.picture import style
from tenplex.compiler.emit.picture.hosts import draw_hosts, layout
from tenplex.compiler.emit.picture.rounds import bubble_scale, draw_rounds
from tenplex.compiler.emit.picture.scene import Scene, scene
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC

WIDTH, TITLE, PANEL, HOSTS_MIN, HOSTS_MAX = 12.0, 0.75, 7.6, 3.0, 7.0  # inches
ROW, LEFT, RIGHT = 0.32, 1.9, 1.9
_RC = {
    "svg.hashsalt": "tenplex",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "figure.dpi": 100,
    "savefig.dpi": 150,
}
_METADATA = {"svg": {"Date": None, "Creator": "tenplex"}, "png": {"Software": "tenplex"}}


def _bubble(label: str, **colors: str) -> Line2D:
    return Line2D([], [], ls="", marker="o", ms=9, label=label, **colors)


def _legend(fig: Figure, s: Scene, x: float, y: float) -> None:
    full = human_bytes(bubble_scale(s))
    handles = [
        Line2D([], [], color=style.NETWORK, lw=4, label="messages between hosts (width by bytes)"),
        Line2D([], [], color=style.LOCAL, lw=1.3, ls="--", label="messages within a host"),
        _bubble(
            f"a round's messages between two hosts\n(area by bytes; full size: {full} or more)", color=style.NETWORK
        ),
        _bubble("a round's same-host messages (same scale)", mfc=style.LOCAL_FILL, mec=style.LOCAL),
    ]
    roles = sorted({d.role for h in s.hosts for d in h.devices}, key=list(style.ROLE_FILL).index)
    for r in roles:
        handles.append(Patch(facecolor=style.ROLE_FILL[r], edgecolor=style.FRAME, lw=0.6, label=style.ROLE_TEXT[r]))
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(x, y), fontsize=style.NORMAL, frameon=False, title="legend",
               title_fontproperties={"weight": "bold", "size": style.NORMAL + 1}, alignment="left")  # fmt: skip


def _figure(s: Scene) -> Figure:
    at = layout(s)
    hosts_w = min(PANEL, HOSTS_MAX / at.aspect)
    hosts_h = max(HOSTS_MIN, hosts_w * at.aspect)
    rounds_h = ROW * max(len(s.rows), 1) + 1.3
    height = TITLE + hosts_h + rounds_h
    fig = Figure(figsize=(WIDTH, height))
    fig.text(0.2 / WIDTH, 1 - 0.3 / height, s.title, fontsize=style.LARGE + 3, weight="bold", va="center")
    fig.text(0.2 / WIDTH, 1 - 0.6 / height, "hosts are frames, devices boxes; arrows are the coalesced messages between hosts",
             fontsize=style.NORMAL, va="center", color=style.FRAME)  # fmt: skip
    draw_hosts(fig.add_axes((0.2 / WIDTH, rounds_h / height, hosts_w / WIDTH, hosts_h / height)), s, at)
    side = (PANEL + 0.5) / WIDTH
    _legend(fig, s, side, 1 - TITLE / height)
    fig.text(
        side + 0.005,
        (rounds_h + 0.2) / height,
        "\n".join(s.summary),
        fontsize=style.NORMAL,
        va="bottom",
        linespacing=1.5,
    )
    plot_w = WIDTH - LEFT - RIGHT
    cell_points = min(plot_w * 72 / max(s.rounds, 1), ROW * 72)
    rounds = fig.add_axes((LEFT / WIDTH, 0.75 / height, plot_w / WIDTH, (rounds_h - 1.25) / height))
    draw_rounds(rounds, s, cell_points)
    return fig


def render(plan: Plan, src: PTC, dst: PTC, fmt: str) -> bytes:
    """The plan's picture as `fmt` ("svg" or "png") bytes, the same for the same plan."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # the user's matplotlibrc must not change the picture
        matplotlib.rcParams.update(_RC)
        fig = _figure(scene(plan, src, dst))
        out = io.BytesIO()
        fig.savefig(out, format=fmt, metadata=_METADATA[fmt])
    return out.getvalue()
