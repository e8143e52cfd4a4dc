"""Draw tenplex's layers from its own import graph: `python docs/architecture.py`.

Writes `docs/img/architecture.json` (every import between two components of `tenplex`, where a
component is a top-level package, or a subpackage of `runtime` and `frameworks`) and
`docs/img/architecture.png` (the components in the rows of the import-linter layers, `runtime` and
`frameworks` as frames around their subpackages, an arrow per import, from the importer down to
what it imports). `tests/test_architecture.py` checks
that the committed JSON is the code's graph today, so the picture cannot go stale unnoticed.

Needs grimp (with import-linter), networkx and matplotlib: `make test` installs them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
EXPAND = ("tenplex.runtime", "tenplex.frameworks")  # drawn as their subpackages
# Rows, top to bottom: the import-linter layers (pyproject.toml), subpackages inside their layer.
GRID = [
    ["cli"],
    ["elastic"],
    ["frameworks.formats", "frameworks.megatron_dist", "frameworks.deepspeed", "frameworks.dcp", "frameworks.structure", "frameworks.hf",
     "frameworks.dtensor", "frameworks.megatron"],
    ["runtime.reshard", "runtime.runtime", "runtime.agent"],
    ["runtime.checkpoint", "runtime.fuse", "runtime.rest", "runtime.oracle", "runtime.netns", "runtime.shm"],
    ["runtime.store", "runtime.executor", "runtime.transport", "runtime.arrays"],
    ["proofs"],
    ["compiler", "frontends", "data"],
    ["ir"],
]
GROUPS = ("frameworks", "runtime")  # drawn as a frame around their subpackages
COLORS = {"cli": "#d9d9d9", "elastic": "#f4cccc", "frameworks": "#f9cb9c", "runtime": "#9fc5e8",
          "compiler": "#d9ead3", "frontends": "#d9ead3", "data": "#ead1dc", "ir": "#fff2cc", "proofs": "#d0e0e3"}  # fmt: skip


def component(module: str) -> str | None:
    """`tenplex.runtime.agent.rounds` -> `runtime.agent`; None outside the components."""
    parts = module.split(".")
    if parts[0] != "tenplex" or len(parts) < 2 or parts[1].startswith("_"):
        return None
    if ".".join(parts[:2]) in EXPAND and len(parts) > 2:
        return ".".join(parts[1:3])
    return parts[1]


def edges() -> list[list[str]]:
    """[importer, imported] for every pair of components with a direct import, sorted."""
    import grimp

    graph = grimp.build_graph("tenplex")
    found = set()
    for module in graph.modules:
        a = component(module)
        for imported in graph.find_modules_directly_imported_by(module):
            b = component(imported)
            if a is not None and b is not None and a != b:
                found.add((a, b))
    return sorted([a, b] for a, b in found)


def modules_of(name: str) -> list[str]:
    """The modules and subpackages a component holds (names, for the box's second line)."""
    path = ROOT / "tenplex" / name.replace(".", "/")
    if not path.is_dir():
        return []
    return sorted(p.stem if p.suffix else p.name + "/" for p in path.iterdir()
                  if (p.suffix == ".py" and not p.stem.startswith("_")) or (p / "__init__.py").is_file())  # fmt: skip


def _layout(width: float) -> tuple[dict[str, tuple[float, float, float]], dict[str, tuple[float, float, float, float]]]:
    """Boxes {name: (x, y, w)} and group frames {group: (x0, y0, x1, y1)}, rows top to bottom."""
    boxes, frames, y = {}, {}, 0.0
    for row in GRID:
        groups = {n.split(".")[0] for n in row}
        for i, name in enumerate(row):
            w = min(width / len(row) - 0.35, 4.4)
            boxes[name] = ((i + 0.5) * width / len(row), y, w)
        for g in groups & set(GROUPS):
            x0, y0, x1, y1 = frames.get(g, (0.1, y + 0.55, width - 0.1, y - 0.55))
            frames[g] = (x0, max(y0, y + 0.55), x1, min(y1, y - 0.55))
        y -= 1.15
    return boxes, frames


def draw(pairs: list[list[str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    width = 15.0
    boxes, frames = _layout(width)
    fig, ax = plt.subplots(figsize=(width, 1.15 * len(GRID) + 0.8))

    def top(name: str) -> str:
        return name.split(".")[0]

    def anchor(name: str, upper: bool) -> tuple[float, float]:
        if name in frames:
            x0, y0, x1, y1 = frames[name]
            return (x0 + x1) / 2, y0 if upper else y1
        x, y, _ = boxes[name]
        return x, y + (0.28 if upper else -0.28)

    inner = [(a, b) for a, b in pairs if top(a) == top(b) and top(a) in GROUPS]
    outer = sorted({(top(a) if top(a) in GROUPS else a, top(b) if top(b) in GROUPS else b)
                    for a, b in pairs if top(a) != top(b) and b != "ir"})  # fmt: skip
    def span(name: str) -> tuple[float, float]:
        if name in frames:
            return frames[name][0] + 0.6, frames[name][2] - 0.6
        x, _, w = boxes[name]
        return x - w / 2 + 0.15, x + w / 2 - 0.15

    def spread(name: str, others: list[str], upper: bool) -> dict[str, tuple[float, float]]:
        """Distinct anchors along `name`'s edge for arrows to (or from) `others`, ordered by their x."""
        lo, hi = span(name)
        y = anchor(name, upper)[1]
        order = sorted(others, key=lambda o: anchor(o, not upper)[0])
        return {o: (lo + (hi - lo) * (i + 1) / (len(order) + 1), y) for i, o in enumerate(order)}

    starts = {a: spread(a, [b for x, b in outer if x == a], False) for a, _ in outer}
    ends = {b: spread(b, [a for a, y in outer if y == b], True) for _, b in outer}
    for a, b in outer:  # between components: orange, behind the boxes they pass
        ax.annotate("", xy=ends[b][a], xytext=starts[a][b], zorder=1.5,
                    arrowprops={"arrowstyle": "-|>", "color": "#b45f06", "lw": 1.0, "alpha": 0.8, "shrinkA": 0,
                                "shrinkB": 0})  # fmt: skip
    for a, b in inner:  # inside a component: grey; within one row from side to side
        xa, ya, wa = boxes[a]
        xb, yb, wb = boxes[b]
        if abs(ya - yb) < 0.1:
            start, end = (xa + (wa / 2 if xb > xa else -wa / 2), ya), (xb - (wb / 2 if xb > xa else -wb / 2), yb)
            rad = -0.25 if xb > xa else 0.25
        else:
            start, end, rad = anchor(a, False), anchor(b, True), 0.05
        ax.annotate("", xy=end, xytext=start, zorder=3,
                    arrowprops={"arrowstyle": "-|>", "color": "#555555", "lw": 0.8, "shrinkA": 1, "shrinkB": 1,
                                "connectionstyle": f"arc3,rad={rad}"})  # fmt: skip
    for g, (x0, y0, x1, y1) in frames.items():
        ax.add_patch(FancyBboxPatch((x0, y1), x1 - x0, y0 - y1, boxstyle="round,pad=0.02", fc=COLORS[g], ec="#444444",
                                    lw=1.0, alpha=0.35, zorder=1))  # fmt: skip
        ax.text(x0 + 0.12, y0 - 0.12, g, ha="left", va="top", fontsize=10, weight="bold", zorder=4)
    for name, (x, y, w) in boxes.items():
        fc = "white" if top(name) in GROUPS else COLORS[name]
        ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.28), w, 0.56, boxstyle="round,pad=0.02", fc=fc, ec="#444444",
                                    lw=0.8, zorder=2))  # fmt: skip
        ax.text(x, y + 0.1, name.split(".")[-1] if top(name) in GROUPS else name, ha="center", va="center",
                fontsize=9.5, weight="bold", zorder=4)  # fmt: skip
        held = ", ".join(modules_of(name))
        limit = int(w * 16)
        held = held if len(held) <= limit else held[: limit - 5].rsplit(",", 1)[0] + ", ..."
        ax.text(x, y - 0.13, held, ha="center", va="center", fontsize=6.3, color="#333333", zorder=4)
    ax.set_xlim(0, width)
    ax.set_ylim(-1.15 * (len(GRID) - 1) - 0.6, 0.6)
    ax.axis("off")
    ax.set_title("tenplex by layer: an arrow is an import, from the importer to what it imports; orange between "
                 "components, grey inside one (every component imports ir: not drawn)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    pairs = edges()
    drawn = {n for row in GRID for n in row}
    missing = sorted({n for pair in pairs for n in pair} - drawn)
    if missing:
        print(f"components not placed in ROWS: {missing}", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "architecture.json").write_text(json.dumps({"edges": pairs}, indent=1) + "\n")
    draw(pairs, OUT / "architecture.png")
    print(f"wrote {OUT / 'architecture.json'} ({len(pairs)} imports) and {OUT / 'architecture.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
