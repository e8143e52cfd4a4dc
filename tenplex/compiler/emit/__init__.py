"""Emitters: a plan as JSON (`tenplex.plan/1`), Graphviz DOT, a plain-text summary, or a picture
(SVG text or PNG bytes, drawn with matplotlib, which only `picture` imports, and only when
it draws).

`EMITTERS` maps each `--emit` name to a function `(plan, src, dst) -> str | bytes`; the
names in `BINARY` give bytes (a file, never a terminal).
"""

from collections.abc import Callable

from tenplex.compiler.emit.dot import to_dot
from tenplex.compiler.emit.fmt import human_bytes, human_seconds, plural, table
from tenplex.compiler.emit.json import to_json
from tenplex.compiler.emit.picture import to_png, to_svg
from tenplex.compiler.emit.text import to_text
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC

EMITTERS: dict[str, Callable[[Plan, PTC, PTC], str | bytes]] = {
    "json": lambda plan, src, dst: to_json(plan),
    "dot": to_dot,
    "text": to_text,
    "svg": to_svg,
    "png": to_png,
}
BINARY = frozenset({"png"})

__all__ = ["BINARY", "EMITTERS", "human_bytes", "human_seconds", "plural", "table", "to_dot", "to_json", "to_png",
           "to_svg", "to_text"]  # fmt: skip
