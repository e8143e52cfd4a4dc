"""z3 encodings of boxes, pieces and plan writes in the LOCAL coordinates of one dst instance.

A dst instance is a sub-tensor on one device. Its local index is a vector `x` of z3 Ints (one
per local dim). Each write of the plan covers a set of local indices:

- a `FillOp` covers its local box directly;
- a `CopyOp` into an equal-extent piece covers its global box translated by
  `piece.local.start - piece.global.start`;
- a `CopyOp` into a flat piece (1-D local run `[s, s+v)` of a multi-extent global box G) covers
  the run offsets `s + rank_G(g)` for g in its box, `rank_G(g) = Σ (g_d - G.start_d)·stride_d`
  (row-major, constant strides). The encoding decodes x into the unique g in G with
  `x = s + rank_G(g)` (mixed-radix digits are unique), so "covered" stays quantifier-free:
  `x in run and g in box`. That is exact only when the copy's box lies inside G, which the
  source query of `proofs.certificate` proves first.

Invariants: every function is pure (fresh variables are named by the caller's prefix), and
`covers` is equivalent to "the runtime's `piece_view` write of this op touches x".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import z3

from tenplex.compiler.ops import CopyOp, FillOp
from tenplex.ir.box import Box
from tenplex.ir.tensor import SubTensor

Write = tuple[int, CopyOp | FillOp]  # (op id, op)


def int_vector(prefix: str, n: int) -> list[z3.ArithRef]:
    return [z3.Int(f"{prefix}{d}") for d in range(n)]


def in_ranges(xs: Sequence[z3.ArithRef], start: Sequence[int], stop: Sequence[int]) -> z3.BoolRef:
    """start <= xs < stop in every dim (True for 0-d)."""
    return z3.And(*[z3.And(a <= x, x < b) for x, a, b in zip(xs, start, stop)])


def in_box(xs: Sequence[z3.ArithRef], box: Box) -> z3.BoolRef:
    return in_ranges(xs, box.start, box.stop)


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides (elements) of an array of `shape`."""
    return tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))


def rank(gs: Sequence[z3.ArithRef], box: Box) -> z3.ArithRef:
    """Row-major rank of point `gs` inside `box` (linear: strides are constants)."""
    return z3.Sum(*[(g - a) * s for g, a, s in zip(gs, box.start, strides(box.shape))], z3.IntVal(0))


class LocalFrame:
    """The local index `x` of one dst instance and the global point each piece maps it to."""

    def __init__(self, st: SubTensor, prefix: str = "x"):
        self.st = st
        self.prefix = prefix
        self.x = int_vector(prefix, len(st.shape))
        self.domain = in_ranges(self.x, (0,) * len(st.shape), st.shape)
        self.decode: list[z3.BoolRef] = []
        self._g: dict[int, list[z3.ArithRef]] = {}

    def global_point(self, j: int) -> list[z3.ArithRef]:
        """Global point of x through flat piece j (decoded once, constraints in `decode`)."""
        if j not in self._g:
            piece = self.st.pieces[j]
            g = int_vector(f"{self.prefix}_p{j}_g", piece.global_box.ndim)
            run, box = piece.local_box, piece.global_box
            self.decode.append(
                z3.Implies(in_box(self.x, run), z3.And(self.x[0] == run.start[0] + rank(g, box), in_box(g, box)))
            )
            self._g[j] = g
        return self._g[j]

    def in_piece(self, j: int) -> z3.BoolRef:
        return in_box(self.x, self.st.pieces[j].local_box)

    def in_any_piece(self) -> z3.BoolRef:
        return z3.Or(*[self.in_piece(j) for j in range(len(self.st.pieces))], z3.BoolVal(False))

    def covers(self, op: CopyOp | FillOp) -> z3.BoolRef:
        """x lies in the local region that `op` writes."""
        if isinstance(op, FillOp):
            return in_box(self.x, op.box)
        piece = self.st.pieces[op.dst_piece]
        if piece.flat:
            return z3.And(self.in_piece(op.dst_piece), in_box(self.global_point(op.dst_piece), op.box))
        shift = [lo - g for lo, g in zip(piece.local_box.start, piece.global_box.start)]
        return in_ranges(
            self.x, [a + s for a, s in zip(op.box.start, shift)], [b + s for b, s in zip(op.box.stop, shift)]
        )

    def misplaced(self, op: CopyOp | FillOp) -> z3.BoolRef:
        """x is written by `op` but should not be: a copy outside its piece, a fill inside a piece."""
        inside = self.in_any_piece() if isinstance(op, FillOp) else z3.Not(self.in_piece(op.dst_piece))
        return z3.And(self.covers(op), inside)

    def point(self, model: z3.ModelRef) -> tuple[int, ...]:
        return tuple(model.eval(v, model_completion=True).as_long() for v in self.x)


def describe(i: int, op: CopyOp | FillOp) -> str:
    """One line naming a write, for counterexamples."""
    if isinstance(op, FillOp):
        return f"op {i} fill local box {op.box}"
    side = "" if op.src_side == "src" else " (forward from dst)"
    return f"op {i} copy global box {op.box} into piece {op.dst_piece} from {op.src_subtensor!r} piece {op.src_piece} on device {op.src_device}{side}"
