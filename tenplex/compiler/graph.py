"""`OpGraph`: the plan's ops on the nodes of a networkx DiGraph, typed edges between them.

networkx is the container, not the type system: each node is an int key whose `op` attribute
is a frozen op (`tenplex.compiler.ops`); each edge has a `kind` (`EdgeKind`). `ORDER` edges say
that the target reads what the source wrote (forwarding inside a host).

Invariants:
- node keys are ints, allocated in increasing insertion order (so iteration is deterministic);
- every node carries an op; every edge carries an `EdgeKind`;
- the graph is acyclic.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator

import networkx as nx

from tenplex.compiler.ops import Op
from tenplex.ir.errors import IRError


class EdgeKind(enum.Enum):
    ORDER = "order"


class OpGraph:
    def __init__(self) -> None:
        self._g = nx.DiGraph()
        self._next = 0

    def add(self, op: Op) -> int:
        key = self._next
        self._g.add_node(key, op=op)
        self._next += 1
        return key

    def add_all(self, ops: Iterable[Op]) -> list[int]:
        return [self.add(op) for op in ops]

    def add_edge(self, src: int, dst: int, kind: EdgeKind = EdgeKind.ORDER) -> None:
        if src not in self._g or dst not in self._g:
            raise IRError(f"edge {src} -> {dst} names a node that is not in the graph")
        self._g.add_edge(src, dst, kind=kind)

    def remove(self, key: int) -> None:
        self._g.remove_node(key)

    def op(self, key: int) -> Op:
        return self._g.nodes[key]["op"]

    def items(self) -> Iterator[tuple[int, Op]]:
        """(key, op) in insertion order."""
        yield from self._g.nodes(data="op")

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def edges(self) -> Iterator[tuple[int, int, EdgeKind]]:
        yield from self._g.edges(data="kind")

    def predecessors(self, key: int) -> list[int]:
        return sorted(self._g.predecessors(key))

    def successors(self, key: int) -> list[int]:
        return sorted(self._g.successors(key))

    def generations(self) -> list[list[int]]:
        """Nodes by dependency depth (networkx `topological_generations`); raises on a cycle."""
        try:
            return [sorted(g) for g in nx.topological_generations(self._g)]
        except nx.NetworkXUnfeasible:
            raise IRError("op graph has a cycle") from None

    def freeze(self) -> OpGraph:
        nx.freeze(self._g)
        return self

    @property
    def frozen(self) -> bool:
        return nx.is_frozen(self._g)
