"""The hosts panel: a frame per host on an ellipse, its devices inside (coloured by role) or,
when there are too many, a count; an arrow per host pair that exchanges messages, its width by
bytes; a dashed loop for each host's same-host messages. With few hosts and pairs, arrows and
loops are labelled with bytes, messages and rounds; with more, the rounds panel has the numbers.
"""

from __future__ import annotations

import math

import attrs
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from tenplex.compiler.emit.flows import Traffic, round_ranges
from tenplex.compiler.emit.fmt import human_bytes, plural
from tenplex.compiler.emit.picture import style
from tenplex.compiler.emit.picture.scene import HostView, Scene

DW, DH, GAP, HEADER = 1.0, 0.62, 0.12, 0.42  # device box, gap, host name strip (data units)
MAX_LABELLED_PAIRS, MAX_LABELLED_HOSTS = 12, 8  # beyond either: no labels on arrows and loops
_RAD = 0.15  # the arrows' curvature: a -> b and b -> a bend apart


@attrs.frozen
class Layout:
    """Where the frames go: centres (in host order), frame size, device columns (0: a count of
    devices), whether to label, and the panel's limits."""

    centres: tuple[tuple[float, float], ...]
    w: float
    h: float
    cols: int
    labels: bool
    xlim: tuple[float, float]
    ylim: tuple[float, float]

    @property
    def aspect(self) -> float:
        """Height over width of the panel's data."""
        return (self.ylim[1] - self.ylim[0]) / (self.xlim[1] - self.xlim[0])


def layout(scene: Scene) -> Layout:
    w, h, cols = _frame_size(scene)
    labels = len(scene.pairs) <= MAX_LABELLED_PAIRS and len(scene.hosts) <= MAX_LABELLED_HOSTS
    gap_x, gap_y = (4.5, 2.5) if labels else (1.5, 1.6)  # room between frames for labels, or just arrows
    centres = _positions(len(scene.hosts), w + gap_x, h + gap_y)
    xs, ys = [c[0] for c in centres] or [0.0], [c[1] for c in centres] or [0.0]
    xlim = (min(xs) - w / 2 - 0.3, max(xs) + w / 2 + (2.9 if labels else 0.3))  # the loops' labels go right
    ylim = (min(ys) - h / 2 - 1.4, max(ys) + h / 2 + 1.4)
    return Layout(tuple(centres), w, h, cols, labels, xlim, ylim)


def draw_hosts(ax: Axes, scene: Scene, at: Layout) -> None:
    """Draw the panel into `ax`, whose box should have `at.aspect` (limits and axis set here)."""
    where = dict(zip((host.name for host in scene.hosts), at.centres))
    frames = {host.name: _host(ax, host, where[host.name], at) for host in scene.hosts}
    for host in scene.hosts:
        if host.local is not None:
            _loop(ax, host.local, where[host.name], at)
    biggest = max((p.bytes for p in scene.pairs), default=0) or 1
    for p in scene.pairs:
        width = 0.8 + 5.2 * p.bytes / biggest
        _arrow(ax, p, (where[p.src_host], where[p.dst_host]), (frames[p.src_host], frames[p.dst_host]), at, width)
    ax.set_xlim(*at.xlim)
    ax.set_ylim(*at.ylim)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()


def rounds_text(t: Traffic) -> str:
    return f"round{'s' if len(t.rounds) > 1 else ''} {round_ranges(t.rounds)}"


def _frame_size(scene: Scene) -> tuple[float, float, int]:
    """(width, height, device columns) of every host frame."""
    if not scene.per_device:
        return 2.6, 1.25, 0
    most = max((len(h.devices) for h in scene.hosts), default=1) or 1
    cols = min(4, most)
    rows = math.ceil(most / cols)
    return cols * DW + (cols + 1) * GAP, rows * (DH + GAP) + GAP + HEADER, cols


def _positions(n: int, pitch_x: float, pitch_y: float) -> list[tuple[float, float]]:
    """Host centres on an ellipse, counter-clockwise from the top left, neighbours at least
    about one pitch apart."""
    if n == 1:
        return [(0.0, 0.0)]
    s = math.sin(math.pi / n)
    rx, ry, start = pitch_x / (2 * s), pitch_y / (2 * s), math.pi / 2 + math.pi / n
    return [(rx * math.cos(start + 2 * math.pi * i / n), ry * math.sin(start + 2 * math.pi * i / n)) for i in range(n)]


def _host(ax: Axes, host: HostView, centre: tuple[float, float], at: Layout) -> FancyBboxPatch:
    (x, y), w, h = centre, at.w, at.h
    roles = {d.role for d in host.devices}
    fill = style.ROLE_FILL[roles.pop()] if not at.cols and len(roles) == 1 else "#fbfcfc"
    frame = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.15",
                           facecolor=fill, edgecolor=style.FRAME, lw=1.4, zorder=1)  # fmt: skip
    ax.add_patch(frame)
    ax.text(
        x - w / 2 + GAP, y + h / 2 - HEADER / 2, host.name, ha="left", va="center", fontsize=style.LARGE, weight="bold"
    )
    if at.cols:
        _devices(ax, host, x - w / 2, y + h / 2, at.cols)
    else:
        _count(ax, host, x, y - HEADER / 2)
    return frame


def _devices(ax: Axes, host: HostView, x0: float, y_top: float, cols: int) -> None:
    for i, d in enumerate(host.devices):
        x = x0 + GAP + (i % cols) * (DW + GAP)
        y = y_top - HEADER - (i // cols + 1) * (DH + GAP)
        ax.add_patch(Rectangle((x, y), DW, DH, facecolor=style.ROLE_FILL[d.role], edgecolor=style.FRAME, lw=0.6))
        ax.text(x + DW / 2, y + DH * 0.68, f"d{d.id}", ha="center", va="center", fontsize=style.NORMAL, weight="bold")
        ax.text(x + DW / 2, y + DH * 0.27, d.label[:11], ha="center", va="center", fontsize=style.SMALL - 1.5)


def _count(ax: Axes, host: HostView, x: float, y: float) -> None:
    """A host with too many devices to draw: their ids, and how many have each role."""
    ids = sorted(d.id for d in host.devices)
    roles = [d.role for d in host.devices]
    span = f"d{ids[0]}-d{ids[-1]}" if ids else "no devices"
    parts = ", ".join(f"{roles.count(r)} {style.ROLE_WORD[r]}" for r in style.ROLE_FILL if roles.count(r))
    ax.text(x, y, f"{span}\n{parts}", ha="center", va="center", fontsize=style.SMALL)


def _loop(ax: Axes, t: Traffic, centre: tuple[float, float], at: Layout) -> None:
    """Same-host messages: a dashed loop on the frame's outer edge (top in the upper half)."""
    x, y = centre
    up = y >= 0
    edge = y + at.h / 2 if up else y - at.h / 2
    ax.add_patch(FancyArrowPatch((x - 0.45, edge), (x + 0.45, edge), connectionstyle=f"arc3,rad={-1.3 if up else 1.3}",
                                 arrowstyle="-|>", mutation_scale=9, color=style.LOCAL, lw=1.3, linestyle="--"))  # fmt: skip
    if at.labels:
        text = f"same host: {human_bytes(t.bytes)}, {plural(t.messages, 'message')}\n{rounds_text(t)}"
        ax.text(x + 0.6, edge + (0.35 if up else -0.35), text, ha="left", va="bottom" if up else "top",
                fontsize=style.SMALL, color=style.LOCAL)  # fmt: skip


def _leaves(dx: float, dy: float, w: float, h: float) -> float:
    """The fraction of the way from a frame's centre towards (dx, dy) at which its border is."""
    return min(w / 2 / abs(dx) if dx else math.inf, h / 2 / abs(dy) if dy else math.inf)


def _arrow(ax: Axes, t: Traffic, ends: tuple, frames: tuple, at: Layout, width: float) -> None:
    ax.add_patch(FancyArrowPatch(*ends, patchA=frames[0], patchB=frames[1], connectionstyle=f"arc3,rad={_RAD}",
                                 arrowstyle="-|>", mutation_scale=8 + 2 * width, color=style.NETWORK, lw=width,
                                 alpha=0.85, zorder=2))  # fmt: skip
    if not at.labels:
        return
    # on the quadratic Bezier of arc3, 30% along the part between the frames: labels of crossing
    # arrows sit apart, and off the frames
    (x1, y1), (x2, y2) = ends
    edge = min(_leaves(x2 - x1, y2 - y1, at.w, at.h), 0.5)
    u = edge + 0.3 * (1 - 2 * edge)
    cx, cy = (x1 + x2) / 2 + _RAD * (y2 - y1), (y1 + y2) / 2 - _RAD * (x2 - x1)
    px = (1 - u) ** 2 * x1 + 2 * u * (1 - u) * cx + u**2 * x2
    py = (1 - u) ** 2 * y1 + 2 * u * (1 - u) * cy + u**2 * y2
    text = f"{human_bytes(t.bytes)}, {plural(t.messages, 'message')}\n{rounds_text(t)}"
    ax.text(px, py, text, ha="center", va="center", fontsize=style.SMALL, color=style.NETWORK, zorder=3,
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": style.NETWORK, "lw": 0.5, "alpha": 0.9})  # fmt: skip
