"""The plan as a picture (`tenplex compile --emit svg|png`), drawn with matplotlib: the hosts
with their devices and the messages between them (`hosts`), and the messages of every host pair
by round (`rounds`), from a `scene` computed without matplotlib.

matplotlib (the `plots` extra) is imported only when a picture is drawn, so the compiler
imports and runs without it. The same plan gives the same bytes: matplotlib's default style
(not the user's matplotlibrc), a fixed SVG hash salt, and no date or version in the metadata.

Raises TenplexError (one line, naming the extra to install) when matplotlib is missing.
"""

from __future__ import annotations

from tenplex.compiler.plan import Plan
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC


def to_svg(plan: Plan, src: PTC, dst: PTC) -> str:
    """The picture as an SVG document (text)."""
    return _render(plan, src, dst, "svg").decode()


def to_png(plan: Plan, src: PTC, dst: PTC) -> bytes:
    """The picture as a PNG image (bytes)."""
    return _render(plan, src, dst, "png")


def _render(plan: Plan, src: PTC, dst: PTC, fmt: str) -> bytes:
    try:
        from tenplex.compiler.emit.picture.figure import render
    except ImportError as e:
        if not (e.name or "").startswith("matplotlib"):
            raise
        raise TenplexError(f"--emit {fmt} needs matplotlib, which cannot be imported ({e}); "
                           "install it with: pip install 'tenplex[plots]'") from None  # fmt: skip
    return render(plan, src, dst, fmt)


__all__ = ["to_png", "to_svg"]
