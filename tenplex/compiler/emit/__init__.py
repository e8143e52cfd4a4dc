"""Emitters: a plan as JSON (`tenplex.plan/1`), Graphviz DOT, or a plain-text summary.

`EMITTERS` maps each `--emit` name to a function `(plan, src, dst) -> str`.
"""

from collections.abc import Callable

from tenplex.compiler.emit.dot import to_dot
from tenplex.compiler.emit.fmt import human_bytes, human_seconds, plural, table
from tenplex.compiler.emit.json import to_json
from tenplex.compiler.emit.text import to_text
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC

EMITTERS: dict[str, Callable[[Plan, PTC, PTC], str]] = {
    "json": lambda plan, src, dst: to_json(plan),
    "dot": to_dot,
    "text": to_text,
}

__all__ = ["EMITTERS", "human_bytes", "human_seconds", "plural", "table", "to_dot", "to_json", "to_text"]
