"""`lower`: run the diff and put its needs, fills and value needs on an `OpGraph`."""

from __future__ import annotations

import attrs

from tenplex.compiler.diff import diff
from tenplex.compiler.graph import OpGraph
from tenplex.compiler.program import Program


@attrs.frozen
class Lower:
    name = "lower"
    requires = frozenset()
    provides = frozenset({"lowered"})

    def apply(self, program: Program) -> Program:
        d = diff(program.src, program.dst, program.pieces)
        graph = OpGraph()
        graph.add_all(d.needs)
        graph.add_all(d.fills)
        graph.add_all(d.values)  # type: ignore[arg-type]
        return attrs.evolve(program, diff=d, graph=graph)
