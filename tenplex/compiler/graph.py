"""`OpGraph`: the plan's ops on the nodes of a networkx DiGraph, typed edges between them.

networkx is the container, not the type system: each node is an int key whose `op` attribute
is a frozen op (`tenplex.compiler.ops`); each edge has a `kind` (`EdgeKind`). `ORDER` edges say
that the target reads what the source wrote (forwarding inside a host).

Passes add hundreds of thousands of ops, so the graph keeps them in insertion-ordered maps and
hands them to networkx in one bulk call when a graph algorithm or `freeze` needs the DiGraph.

Invariants:
- node keys are ints, allocated in increasing insertion order (so iteration is deterministic);
- every node carries an op; every edge carries an `EdgeKind` and joins two existing nodes;
- the graph is acyclic (checked by `generations`).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING

from tenplex.compiler.ops import Op
from tenplex.ir.errors import IRError

if TYPE_CHECKING:
    import networkx as nx


class EdgeKind(enum.Enum):
    ORDER = "order"


class OpGraph:
    def __init__(self) -> None:
        self._ops: dict[int, Op] = {}
        self._edges: dict[tuple[int, int], EdgeKind] = {}
        self._preds: dict[int, list[int]] = defaultdict(list)
        self._next = 0
        self._frozen = False

    def _mutable(self) -> None:
        if self._frozen:
            raise IRError("op graph is frozen")
        self.__dict__.pop("nx", None)

    def add(self, op: Op) -> int:
        if self._frozen or "nx" in self.__dict__:
            self._mutable()
        key = self._next
        self._ops[key] = op
        self._next += 1
        return key

    def add_all(self, ops: Iterable[Op]) -> list[int]:
        self._mutable()
        ops = list(ops)
        keys = range(self._next, self._next + len(ops))
        self._ops.update(zip(keys, ops))
        self._next += len(ops)
        return list(keys)

    def add_edge(self, src: int, dst: int, kind: EdgeKind = EdgeKind.ORDER) -> None:
        self._mutable()
        if src not in self._ops or dst not in self._ops:
            raise IRError(f"edge {src} -> {dst} names a node that is not in the graph")
        self._edges[(src, dst)] = kind
        self._preds[dst].append(src)

    def op(self, key: int) -> Op:
        return self._ops[key]

    def items(self) -> Iterator[tuple[int, Op]]:
        """(key, op) in insertion order."""
        return iter(self._ops.items())

    def keys(self) -> tuple[int, ...]:
        return tuple(self._ops)

    def ops(self) -> tuple[Op, ...]:
        return tuple(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def edges(self) -> Iterator[tuple[int, int, EdgeKind]]:
        return ((a, b, k) for (a, b), k in self._edges.items())

    def predecessors(self, key: int) -> list[int]:
        preds = self._preds.get(key)
        return sorted(preds) if preds else []

    @cached_property
    def nx(self) -> nx.DiGraph:
        """The networkx DiGraph (node attr `op`, edge attr `kind`), built in bulk."""
        import networkx as nx  # only here: compiling needs no graph algorithm, and networkx costs ~0.1 s to import

        g = nx.DiGraph()
        g.add_nodes_from((k, {"op": op}) for k, op in self._ops.items())
        g.add_edges_from((a, b, {"kind": k}) for (a, b), k in self._edges.items())
        if self._frozen:
            nx.freeze(g)
        return g

    def generations(self) -> list[list[int]]:
        """Nodes by dependency depth (networkx `topological_generations`); raises on a cycle."""
        import networkx as nx

        try:
            return [sorted(g) for g in nx.topological_generations(self.nx)]
        except nx.NetworkXUnfeasible:
            raise IRError("op graph has a cycle") from None

    def freeze(self) -> OpGraph:
        self.__dict__.pop("nx", None)
        self._frozen = True
        return self

    @property
    def frozen(self) -> bool:
        return self._frozen
