"""`Program`: the compiler's state between passes, and the `Pass` protocol.

A pass is a small frozen object with a `name`, the facts it `requires` and `provides`, and
`apply(program) -> program`. `run_passes` checks the facts, so passes cannot run out of order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np

from tenplex.compiler.diff import Diff
from tenplex.compiler.graph import OpGraph
from tenplex.compiler.nogc import without_gc
from tenplex.compiler.pieces import Pieces
from tenplex.compiler.plan import CompileOptions
from tenplex.compiler.table import MessageTable, OpTable
from tenplex.ir.errors import CompileError, IRError
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import Topology


@attrs.frozen
class Program:
    src: PTC
    dst: PTC
    options: CompileOptions
    topology: Topology  # src and dst devices together
    diff: Diff | None = None
    graph: OpGraph | None = None  # the lowered needs, fills and value needs
    table: OpTable | None = None  # the ops, once sources are chosen
    edges: np.ndarray | None = None  # (n, 2) order edges between op ids of `table`
    messages: MessageTable | None = None
    lower_bounds: dict[str, int] | None = None  # per dst host, for dst's allocation (cached)
    facts: frozenset[str] = frozenset()
    pieces: Pieces | None = None  # both PTCs' piece boxes, read once (`Program.start`)

    @classmethod
    def start(cls, src: PTC, dst: PTC, options: CompileOptions) -> Program:
        try:
            topology = src.topology.union(dst.topology)
        except IRError as e:
            raise CompileError(f"src and dst disagree on the topology: {e}") from None
        return cls(src, dst, options, topology, pieces=Pieces.read(src, dst))

    def host_of(self, device: int) -> str:
        return self.topology.host_of(device)

    def itemsize(self, tensor: str) -> int:
        return self.dst.itemsize(tensor)


class Pass(Protocol):
    name: str
    requires: frozenset[str]
    provides: frozenset[str]

    def apply(self, program: Program) -> Program: ...


@without_gc
def run_passes(program: Program, passes: Sequence[Pass]) -> Program:
    for p in passes:
        missing = p.requires - program.facts
        if missing:
            raise CompileError(f"pass {p.name!r} requires {sorted(missing)}, which no earlier pass provides")
        program = p.apply(program)
        program = attrs.evolve(program, facts=program.facts | p.provides)
    return program
