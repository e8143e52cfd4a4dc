"""General lemmas over SYMBOLIC sizes, proved with z3 (each one query per concrete rank count).

Rank counts t, t' range over 1..max_ranks (concrete, so `i·c` stays linear); sizes (chunk rows
c, vocabulary V, padding multiple m, matrix rows/cols) are unbounded z3 Ints. Integer division
is encoded with explicit quotient variables. Each lemma returns a `Proved` record or raises
`LemmaError` with the counterexample model.

- (a) `rechunk_exact_cover`: an even split of N = t·c rows re-chunked into t' chunks
  (N = t'·c') is an exact cover, with copy boxes = src ∩ dst chunk and valid local offsets.
- (b) `glu_rechunk_preserves_rows`: with rank r holding [W_r; V_r] (two pieces), every canonical
  [W; V] row has one src and one dst holder, in the same half, at consistent local offsets.
- (c) `vocab_padding_fills`: Vp = ceil(V/(m·t))·m·t (Python's floor-div form) is >= V, < V + m·t
  and divisible by t; global row v < V has exactly one owner; padded rows are exactly the fill.
- (d) `row_major_boxes_exact`: `tenplex.ir.box.row_major_boxes` on symbolic R x C shapes covers
  exactly the flat range [a, b) as a chain of row-major runs (the 2-D branch structure of the
  code, cross-checked against the code on every small case).
- (e) `forward_once_per_host`: one network transfer per host plus in-host forwards reaches all
  k devices; zero network transfers into a host without a local holder reach none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import z3

from tenplex.ir.box import Box, row_major_boxes


class LemmaError(AssertionError):
    """A lemma's claim has a counterexample (or z3 gave up)."""


@attrs.frozen
class Proved:
    name: str
    queries: int
    seconds: float


def prove(
    name: str, claim: z3.BoolRef, hyps: Sequence[z3.BoolRef] = (), timeout_ms: int = 20_000, logic: str | None = None
) -> None:
    """Prove `hyps ⇒ claim` (unsat of hyps ∧ ¬claim), with a solver for `logic` if given.
    Raises LemmaError with the model."""
    solver = z3.SolverFor(logic) if logic else z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*hyps, z3.Not(claim))
    result = solver.check()
    if result == z3.unsat:
        return
    if result == z3.unknown:
        raise LemmaError(f"lemma {name}: z3 returned unknown ({solver.reason_unknown()})")
    raise LemmaError(f"lemma {name} fails: counterexample {solver.model()}")


def exactly_one(conds: Sequence[z3.BoolRef]) -> z3.BoolRef:
    return z3.Sum(*[z3.If(c, 1, 0) for c in conds], z3.IntVal(0)) == 1


def _timed(name: str, body: Callable[[], int]) -> Proved:
    t0 = time.perf_counter()
    n = body()
    return Proved(name, n, time.perf_counter() - t0)


def _in(v: z3.ArithRef, lo: z3.ArithRef | int, hi: z3.ArithRef | int) -> z3.BoolRef:
    return z3.And(lo <= v, v < hi)


def rechunk_exact_cover(max_ranks: int = 8) -> Proved:
    """(a) For t, t' in 1..max_ranks and symbolic c, c' >= 1 with t·c = t'·c'."""

    def body() -> int:
        c, cd, lo = z3.Ints("c c_dst l_dst")
        for t in range(1, max_ranks + 1):
            for td in range(1, max_ranks + 1):
                prove(
                    f"rechunk {t}->{td}",
                    z3.And(*[_rechunk_claim(t, td, c, cd, lo, j) for j in range(td)]),
                    [c >= 1, cd >= 1, t * c == td * cd],
                    logic="QF_LIA",
                )
        return max_ranks * max_ranks

    return _timed("rechunk_exact_cover", body)


def _rechunk_claim(t: int, td: int, c: z3.ArithRef, cd: z3.ArithRef, lo: z3.ArithRef, j: int) -> z3.BoolRef:
    """Every local row `lo` of dst chunk j is written by exactly one copy (box = src chunk i ∩
    dst chunk j, mirroring Box.intersect), read at a valid src local offset of the same row."""
    row = j * cd + lo
    hits, ok = [], []
    for i in range(t):
        start = z3.If(i * c > j * cd, i * c, j * cd)
        stop = z3.If((i + 1) * c < (j + 1) * cd, (i + 1) * c, (j + 1) * cd)
        hit = _in(row, start, stop)
        src_local = row - i * c
        hits.append(hit)
        ok.append(z3.Implies(hit, z3.And(_in(src_local, 0, c), i * c + src_local == row, _in(row, 0, t * c))))
    return z3.Implies(_in(lo, 0, cd), z3.And(exactly_one(hits), *ok))


def _glu_holders(
    q: z3.ArithRef, t: int, f: z3.ArithRef, n: z3.ArithRef
) -> list[tuple[z3.BoolRef, z3.ArithRef, int, z3.ArithRef]]:
    """(holds row q, local row of q, half, canonical row of that local row) for each (rank,
    piece) of a GLU layout over t ranks: rank r holds W rows [r·n, (r+1)·n) at local [0, n) and
    V rows [f + r·n, f + (r+1)·n) at local [n, 2n)."""
    out = []
    for r in range(t):
        for half in (0, 1):
            g0 = half * f + r * n
            local = q - g0 + half * n
            out.append((_in(q, g0, g0 + n), local, half, half * f + r * n + (local - half * n)))
    return out


def glu_rechunk_preserves_rows(max_ranks: int = 8) -> Proved:
    """(b) For t, t' in 1..max_ranks, symbolic f = t·n = t'·n' and every row q of [W; V]: one src
    and one dst holder; each holder's piece is q's half (so gate rows stay gate rows: local row
    < n iff q < f, on both sides), its local row is in range and maps back to canonical row q."""

    def body() -> int:
        q, n, nd = z3.Ints("q n n_dst")
        for t in range(1, max_ranks + 1):
            for td in range(1, max_ranks + 1):
                f = t * n
                claims = []
                for holders, rows in ((_glu_holders(q, t, f, n), n), (_glu_holders(q, td, f, nd), nd)):
                    claims.append(exactly_one([h for h, *_ in holders]))
                    for held, local, half, canon in holders:
                        right = z3.And(
                            z3.If(q < f, 0, 1) == half,
                            (local < rows) == (half == 0),
                            _in(local, 0, 2 * rows),
                            canon == q,
                        )
                        claims.append(z3.Implies(held, right))
                prove(
                    f"glu {t}->{td}", z3.And(*claims), [n >= 1, nd >= 1, f == td * nd, _in(q, 0, 2 * f)], logic="QF_LIA"
                )
        return max_ranks * max_ranks

    return _timed("glu_rechunk_preserves_rows", body)


def vocab_padding_fills(max_ranks: int = 8) -> Proved:
    """(c) For t in 1..max_ranks, symbolic V >= 1 and multiple m >= 1."""

    def body() -> int:
        v, m, q, row, lo = z3.Ints("V m q row l")
        for t in range(1, max_ranks + 1):
            step = m * t
            k = -q  # Vp = -(-V // step) * step; q = (-V) // step, encoded by its floor bounds
            hyps = [v >= 1, m >= 1, step * q <= -v, -v < step * (q + 1)]
            padded, n = k * step, k * m
            prove(f"vocab pad t={t}", z3.And(padded >= v, padded < v + step, padded == t * n, n >= 1), hyps)
            prove(f"vocab owner t={t}", _vocab_owner(t, v, n, row, lo), [*hyps, n >= 1, t * n >= v])
        return 2 * max_ranks

    return _timed("vocab_padding_fills", body)


def _vocab_owner(t: int, v: z3.ArithRef, n: z3.ArithRef, row: z3.ArithRef, lo: z3.ArithRef) -> z3.BoolRef:
    """Row v' < V has exactly one owner; on every rank, local row l is in the piece iff its
    padded global row r·n + l is < V (else it is fill)."""
    owners = [z3.And(r * n <= row, row < z3.If((r + 1) * n < v, (r + 1) * n, v)) for r in range(t)]
    local = []
    for r in range(t):
        piece_rows = z3.If(r * n < v, z3.If((r + 1) * n < v, (r + 1) * n, v) - r * n, 0)
        local.append(z3.Implies(_in(lo, 0, n), (lo < piece_rows) == (r * n + lo < v)))
    return z3.And(z3.Implies(_in(row, 0, v), exactly_one(owners)), *local)


def _rmb_model(
    rows0: z3.ArithRef, off0: z3.ArithRef, rows1: z3.ArithRef, off1: z3.ArithRef, cols: z3.ArithRef
) -> list[tuple[z3.BoolRef, tuple]]:
    """The boxes `row_major_boxes((R, C), a, b)` returns, in order, each with its presence
    condition, for a = row0·C + off0 and b = row1·C + off1 (the code's 2-D branches)."""
    same = rows0 == rows1
    first = z3.If(z3.And(z3.Not(same), off0 > 0), rows0 + 1, rows0)
    return [
        (z3.And(same, off0 < off1), (rows0, rows0 + 1, off0, off1)),
        (z3.And(z3.Not(same), off0 > 0), (rows0, rows0 + 1, off0, cols)),
        (z3.And(z3.Not(same), rows1 > first), (first, rows1, 0, cols)),
        (z3.And(z3.Not(same), off1 > 0), (rows1, rows1 + 1, 0, off1)),
    ]


def row_major_boxes_exact(max_side: int = 4) -> Proved:
    """(d) Symbolic R, C >= 1 and 0 <= a <= b <= R·C; the model is checked against the code on
    every shape with sides <= max_side and every [a, b)."""

    def body() -> int:
        _check_rmb_model(max_side)
        rows, cols, a, b, i, j, r0, o0, r1, o1 = z3.Ints("R C a b i j row0 off0 row1 off1")
        hyps = [
            rows >= 1,
            cols >= 1,
            a >= 0,
            a <= b,
            b <= rows * cols,
            a == r0 * cols + o0,
            _in(o0, 0, cols),
            b == r1 * cols + o1,
            _in(o1, 0, cols),
        ]
        boxes = _rmb_model(r0, o0, r1, o1, cols)
        flat = i * cols + j
        hits = [z3.And(p, _in(i, rl, rh), _in(j, cl, ch)) for p, (rl, rh, cl, ch) in boxes]
        covered = z3.Sum(*[z3.If(h, 1, 0) for h in hits])
        runs = [
            z3.Implies(h, rl * cols + cl + (i - rl) * (ch - cl) + (j - cl) == flat)
            for h, (_, (rl, rh, cl, ch)) in zip(hits, boxes)
        ]
        point = [_in(i, 0, rows), _in(j, 0, cols)]
        prove("row_major_boxes cover", z3.If(_in(flat, a, b), covered == 1, covered == 0), hyps + point)
        prove("row_major_boxes runs", z3.And(*runs), hyps + point)
        prove("row_major_boxes chain", _rmb_chain(boxes, a, b, rows, cols), hyps)
        return 3

    return _timed("row_major_boxes_exact", body)


def _rmb_chain(
    boxes: list[tuple[z3.BoolRef, tuple]], a: z3.ArithRef, b: z3.ArithRef, rows: z3.ArithRef, cols: z3.ArithRef
) -> z3.BoolRef:
    """Present boxes are non-empty, in bounds, and consecutive: each starts where the previous
    one's run ended, the first at a, the last ending at b."""
    cursor, oks = a, []
    for present, (rl, rh, cl, ch) in boxes:
        inside = z3.And(rl >= 0, rl < rh, rh <= rows, cl >= 0, cl < ch, ch <= cols)
        oks.append(z3.Implies(present, z3.And(rl * cols + cl == cursor, inside)))
        cursor = z3.If(present, rl * cols + cl + (rh - rl) * (ch - cl), cursor)
    return z3.And(*oks, cursor == b)


def _num(e: z3.ArithRef | int) -> int:
    return e if isinstance(e, int) else z3.simplify(e).as_long()


def _check_rmb_model(max_side: int) -> None:
    for rows in range(1, max_side + 1):
        for cols in range(1, max_side + 1):
            for a in range(rows * cols + 1):
                for b in range(a, rows * cols + 1):
                    model = _rmb_model(*(z3.IntVal(x) for x in (*divmod(a, cols), *divmod(b, cols), cols)))
                    want = [
                        Box((_num(rl), _num(cl)), (_num(rh), _num(ch)))
                        for p, (rl, rh, cl, ch) in model
                        if z3.is_true(z3.simplify(p))
                    ]
                    got = row_major_boxes((rows, cols), a, b)
                    if got != want:
                        raise LemmaError(
                            f"row_major_boxes(({rows}, {cols}), {a}, {b}) = {got}, but the proved model gives {want}"
                        )


def forward_once_per_host(max_devices: int = 8, max_hosts: int = 3) -> Proved:
    """(e) Round 0: network transfers into a host; round 1: forwards inside it. For h hosts of
    k devices each with no local holder: every schedule delivering the region to all h·k
    devices uses >= h network transfers, and the compiler's (one to the host's first device,
    then forward to the rest) delivers to all with exactly h."""

    def body() -> int:
        for hosts in range(1, max_hosts + 1):
            for k in range(1, max_devices + 1):
                _forward_case(hosts, k)
        return 2 * max_hosts * max_devices

    return _timed("forward_once_per_host", body)


def _forward_case(hosts: int, k: int) -> None:
    net = [[z3.Bool(f"net_{h}_{i}") for i in range(k)] for h in range(hosts)]
    fwd = [[[z3.Bool(f"fwd_{h}_{i}_{j}") for j in range(k)] for i in range(k)] for h in range(hosts)]
    has = [
        [z3.Or(net[h][j], *[z3.And(fwd[h][i][j], net[h][i]) for i in range(k) if i != j]) for j in range(k)]
        for h in range(hosts)
    ]
    delivered = z3.And(*[x for row in has for x in row])
    transfers = z3.Sum(*[z3.If(x, 1, 0) for row in net for x in row])
    prove(f"lower bound {hosts}x{k}", transfers >= hosts, [delivered])
    scheme = [net[h][i] == (i == 0) for h in range(hosts) for i in range(k)]
    scheme += [fwd[h][i][j] == (i == 0) for h in range(hosts) for i in range(k) for j in range(k)]
    prove(f"forward scheme {hosts}x{k}", z3.And(delivered, transfers == hosts), scheme)


LEMMAS: dict[str, Callable[[], Proved]] = {
    "a rechunk_exact_cover": rechunk_exact_cover,
    "b glu_rechunk_preserves_rows": glu_rechunk_preserves_rows,
    "c vocab_padding_fills": vocab_padding_fills,
    "d row_major_boxes_exact": row_major_boxes_exact,
    "e forward_once_per_host": forward_once_per_host,
}
