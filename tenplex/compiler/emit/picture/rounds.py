"""The rounds panel: a row per host pair, a column per round, a bubble where the pair exchanges
messages in that round (area by bytes: filled red over the network, grey and dashed within a
host), and each row's totals on the right. Rounds run in order; the messages of one round are
independent of each other."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from tenplex.compiler.emit.fmt import human_bytes, plural
from tenplex.compiler.emit.picture import style
from tenplex.compiler.emit.picture.scene import Scene


def bubble_scale(scene: Scene) -> int:
    """The bytes of a bubble that fills its cell: the largest cell between hosts (the largest of
    all when no message crosses the network), of one pair. Bigger cells (same-host ones, and
    the sums of merged rows) are drawn full size."""
    pairs = [row for row in scene.rows if not row.merged]
    cells = [c.bytes for row in pairs for c in row.cells if row.network]
    return max(cells or [c.bytes for row in pairs for c in row.cells] or [1]) or 1


def draw_rounds(ax: Axes, scene: Scene, cell_points: float) -> None:
    """Draw the panel into `ax`; `cell_points` is the size of one cell (the smaller of its width
    and height), in points."""
    per_byte = (cell_points * 0.9) ** 2 / bubble_scale(scene)
    for y, row in enumerate(scene.rows):
        xs = [c.rounds[0] for c in row.cells]
        sizes = [min(max(6.0, c.bytes * per_byte), (cell_points * 0.9) ** 2) for c in row.cells]
        if row.network:
            ax.scatter(xs, [y] * len(xs), s=sizes, color=style.NETWORK, alpha=0.85, linewidths=0, zorder=3)
        else:
            ax.scatter(xs, [y] * len(xs), s=sizes, facecolor=style.LOCAL_FILL, edgecolor=style.LOCAL,
                       linewidths=1.0, linestyle="--", zorder=3)  # fmt: skip
        total = f"{human_bytes(row.total.bytes)}, {plural(row.total.messages, 'message')}"
        ax.text(1.01, y, total, transform=ax.get_yaxis_transform(), va="center", fontsize=style.SMALL,
                color=style.NETWORK if row.network else style.LOCAL)  # fmt: skip
    rows = max(len(scene.rows), 1)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_yticks(range(len(scene.rows)), [row.label for row in scene.rows], fontsize=style.NORMAL)
    ax.set_xlim(-0.6, max(scene.rounds, 1) - 0.4)
    if scene.rounds <= 40:
        ax.set_xticks(range(scene.rounds))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(axis="x", labelsize=style.SMALL)
    ax.set_xlabel(
        "round (rounds run one after another; the messages of a round are independent)", fontsize=style.NORMAL
    )
    ax.set_title(
        "coalesced messages per host pair and round (bubble area by bytes)", fontsize=style.NORMAL + 1, loc="left"
    )
    ax.grid(True, color="#eaeded", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
