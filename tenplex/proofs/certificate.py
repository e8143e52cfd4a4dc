"""Per-plan z3 certificates: every element of every dst instance is written exactly once, with
the right data.

For each dst instance (sub-tensor, device under `plan.allocation`) two queries must be unsat:

1. **source** — for a symbolic global point g and each copy k into the instance: g in k's box
   but not in its dst piece's global box, or not held by its source (the src piece's global box;
   for a forward copy, the boxes that earlier-round order-edge predecessors wrote into that dst
   piece). Tensors, devices and piece indices are checked concretely before any query.
2. **cover** — for a symbolic local index x (0 <= x < shape): x is covered by zero writes, by
   two or more, by a copy outside its dst piece's local box, or by a fill inside a piece.

Together they prove that the dst instance equals the dst PTC's materialization: each local
element inside a piece receives exactly the global element the piece maps there, each element
outside all pieces receives the fill. Instances with more than `split_over` writes are proved by
one cover query per piece plus one for the fill region (sound because query 1 already placed
each copy inside its own piece, and pieces are disjoint).

A query is a function of boxes only (the instance's pieces and shape, each write's box and dst
piece, each copy's source box and feeds), so replicas written with the same boxes ask the same
formula: it is solved once per certificate and counts as proved for every instance that asks it.

Raises CertificateError (an AssertionError) with a counterexample: the index and its writers.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Sequence

import attrs
import z3

from tenplex.compiler.ops import CopyOp, FillOp
from tenplex.compiler.plan import Plan
from tenplex.ir.box import Box
from tenplex.ir.errors import IRError
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import SubTensor
from tenplex.proofs.encode import LocalFrame, Write, describe, in_box, int_vector


class CertificateError(AssertionError):
    """A plan is not certified; `index` and `writers` hold the counterexample (if any)."""

    def __init__(
        self,
        message: str,
        subtensor: str | None = None,
        device: int | None = None,
        index: tuple[int, ...] | None = None,
        writers: Sequence[int] = (),
    ):
        super().__init__(message)
        self.subtensor, self.device, self.index, self.writers = subtensor, device, index, tuple(writers)


@attrs.frozen
class InstanceProof:
    subtensor: str
    device: int
    writes: int
    queries: int
    seconds: float


@attrs.frozen
class Certificate:
    """What was proved: one entry per certified dst instance (all of them unless sampled)."""

    instances: tuple[InstanceProof, ...]
    total_instances: int
    seconds: float

    @property
    def queries(self) -> int:
        return sum(p.queries for p in self.instances)

    @property
    def sampled(self) -> bool:
        return len(self.instances) < self.total_instances

    def queries_by_subtensor(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for p in self.instances:
            out[p.subtensor] += p.queries
        return dict(out)


def certify(
    plan: Plan,
    src: PTC,
    dst: PTC,
    timeout_ms: int = 10_000,
    max_instances: int | None = None,
    seed: int = 0,
    split_over: int = 256,
) -> Certificate:
    """Prove `plan` turns `src` into `dst` (see the module docstring).

    `max_instances` certifies a deterministic random sample (by `seed`) of the dst instances;
    the concrete structure checks still cover every op. Value ops are not certified here.

    Raises:
        CertificateError: an op fails a structure check, a query is sat (with the counterexample)
            or unknown (timeout).
    """
    began = time.perf_counter()
    dst = _with_allocation(dst, plan)
    writes = _index_writes(plan, src, dst)
    instances = [(st, d) for st in dst.subtensors for d in dst.devices_of_subtensor(st.id)]
    chosen = instances
    if max_instances is not None and len(instances) > max_instances:
        chosen = sorted(random.Random(seed).sample(instances, max_instances), key=lambda sd: (sd[0].id, sd[1]))
    feeds = _forward_feeds(plan)
    proofs, proved = [], set()
    for st, d in chosen:
        t0 = time.perf_counter()
        ws = writes.get((st.id, d), [])
        n = _prove_sources(src, dst, feeds, st, d, ws, timeout_ms, proved)
        n += _prove_cover(st, d, ws, timeout_ms, split_over, proved)
        proofs.append(InstanceProof(st.id, d, len(ws), n, time.perf_counter() - t0))
    return Certificate(tuple(proofs), len(instances), time.perf_counter() - began)


def _with_allocation(dst: PTC, plan: Plan) -> PTC:
    """dst under the plan's allocation, which may only permute dst's ranks over its devices."""
    old = {pid: len(devs) for pid, devs in dst.allocation.items}
    new = {pid: len(devs) for pid, devs in plan.allocation.items}
    if old != new or dst.allocation.devices != plan.allocation.devices:
        raise CertificateError(
            f"plan allocation {dict(plan.allocation.items)} is not a permutation of dst's {dict(dst.allocation.items)}"
        )
    try:
        return attrs.evolve(dst, allocation=plan.allocation)
    except IRError as e:
        raise CertificateError(f"plan allocation does not fit dst: {e}") from None


def _holds(ptc: PTC, sid: str, device: int) -> SubTensor | None:
    st = ptc.subtensor_map.get(sid)
    return st if st is not None and device in ptc.devices_of_subtensor(sid) else None


def _index_writes(plan: Plan, src: PTC, dst: PTC) -> dict[tuple[str, int], list[Write]]:
    """Writes per dst instance, after the concrete checks every op must pass."""
    out: dict[tuple[str, int], list[Write]] = defaultdict(list)
    for i, op in enumerate(plan.ops):
        if not isinstance(op, CopyOp | FillOp):
            continue
        st = _holds(dst, op.dst_subtensor, op.dst_device)
        if st is None:
            raise CertificateError(
                f"op {i} writes {op.dst_subtensor!r} on device {op.dst_device}, which does not hold it",
                op.dst_subtensor,
                op.dst_device,
                writers=[i],
            )
        if isinstance(op, FillOp) and (
            op.value != st.fill or op.box.ndim != len(st.shape) or not st.local_box.contains(op.box)
        ):
            raise CertificateError(
                f"op {i} fills {st.id!r} local box {op.box} with {op.value}; expected fill {st.fill} inside shape {st.shape}",
                st.id,
                op.dst_device,
                writers=[i],
            )
        if isinstance(op, CopyOp):
            _check_copy(i, op, st, src if op.src_side == "src" else dst)
        out[(st.id, op.dst_device)].append((i, op))
    return out


def _check_copy(i: int, op: CopyOp, dst_st: SubTensor, side: PTC) -> None:
    src_st = _holds(side, op.src_subtensor, op.src_device)
    bad = None
    if dst_st.tensor != op.tensor or not 0 <= op.dst_piece < len(dst_st.pieces):
        bad = f"writes tensor {op.tensor!r} piece {op.dst_piece} into {dst_st.id!r} (tensor {dst_st.tensor!r}, {len(dst_st.pieces)} pieces)"
    elif op.box.ndim != dst_st.pieces[op.dst_piece].global_box.ndim:
        bad = f"writes a {op.box.ndim}-d box {op.box} into a {dst_st.pieces[op.dst_piece].global_box.ndim}-d tensor"
    elif src_st is None:
        bad = f"reads {op.src_side} sub-tensor {op.src_subtensor!r} on device {op.src_device}, which does not hold it"
    elif src_st.tensor != op.tensor or not 0 <= op.src_piece < len(src_st.pieces):
        bad = f"reads tensor {op.tensor!r} piece {op.src_piece} from {src_st.id!r} (tensor {src_st.tensor!r}, {len(src_st.pieces)} pieces)"
    if bad:
        raise CertificateError(f"op {i} {bad}", dst_st.id, op.dst_device, writers=[i])


def _solve(solver: z3.Solver, what: str, st: SubTensor, device: int) -> z3.ModelRef | None:
    result = solver.check()
    if result == z3.unknown:
        raise CertificateError(
            f"{what} query for {st.id!r} on device {device} is unknown ({solver.reason_unknown()})", st.id, device
        )
    return solver.model() if result == z3.sat else None


def _forward_feeds(plan: Plan) -> dict[int, list[Box]]:
    """Forward copy id -> boxes its order-edge predecessors wrote, in earlier rounds, into the
    dst piece it reads (what it may read)."""
    rounds, out = plan.round_of, defaultdict(list)
    for p, i in plan.edges:
        prev, op = plan.ops[p], plan.ops[i]
        if not (isinstance(op, CopyOp) and op.src_side == "dst" and isinstance(prev, CopyOp)):
            continue
        wrote = (prev.dst_subtensor, prev.dst_device, prev.dst_piece)
        if wrote == (op.src_subtensor, op.src_device, op.src_piece) and rounds.get(p, 0) < rounds.get(i, 0):
            out[i].append(prev.box)
    return out


def _prove_sources(src: PTC, dst: PTC, feeds: dict[int, list[Box]], st: SubTensor, device: int, ws: list[Write],
                   timeout_ms: int, proved: set[tuple]) -> int:  # fmt: skip
    copies = [(i, op) for i, op in ws if isinstance(op, CopyOp)]
    if not copies:
        return 0
    # (write box, dst piece's global box, source box, feeds, from src) per copy: the formula's inputs
    boxes = [(op.box, st.pieces[op.dst_piece].global_box,
              (src if op.src_side == "src" else dst).subtensor_map[op.src_subtensor].pieces[op.src_piece].global_box,
              tuple(feeds.get(i, [])), op.src_side == "src") for i, op in copies]  # fmt: skip
    key = ("source", tuple(boxes))
    if key in proved:
        return 1
    g = int_vector("g", len(copies[0][1].box.start))
    bad = []
    for box, piece, held, fed_by, from_src in boxes:
        fed = z3.Or(*[in_box(g, b) for b in fed_by], z3.BoolVal(from_src))
        ok = z3.And(in_box(g, piece), in_box(g, held), fed)
        bad.append(z3.And(in_box(g, box), z3.Not(ok)))
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(z3.Or(*bad))
    model = _solve(solver, "source", st, device)
    if model is not None:
        point = tuple(model.eval(v, model_completion=True).as_long() for v in g)
        k = next(k for k, b in enumerate(bad) if z3.is_true(model.eval(b, model_completion=True)))
        i, op = copies[k]
        raise CertificateError(
            f"dst {st.id!r} on device {device}: global point {point} of {describe(i, op)} is outside its dst piece {st.pieces[op.dst_piece].global_box} or not held by its source",
            st.id,
            device,
            point,
            [i],
        )
    proved.add(key)
    return 1


def _prove_cover(st: SubTensor, device: int, ws: list[Write], timeout_ms: int, split_over: int,
                 proved: set[tuple]) -> int:  # fmt: skip
    if st.volume == 0:
        return 0
    if len(ws) <= split_over:
        return _cover_query(st, device, ws, None, timeout_ms, proved)
    n = 0
    for j, piece in enumerate(st.pieces):
        mine = [
            (i, op)
            for i, op in ws
            if (op.dst_piece == j if isinstance(op, CopyOp) else op.box.overlaps(piece.local_box))
        ]
        n += _cover_query(st, device, mine, j, timeout_ms, proved)
    fills = [(i, op) for i, op in ws if isinstance(op, FillOp)]
    return n + _cover_query(st, device, fills, -1, timeout_ms, proved)


def _cover_query(st: SubTensor, device: int, ws: list[Write], region: int | None, timeout_ms: int,
                 proved: set[tuple]) -> int:  # fmt: skip
    """One query; `region` restricts x to piece `region` (-1: outside every piece; None: all)."""
    key = ("cover", st.shape, st.pieces, region,
           tuple((op.box, -1 if isinstance(op, FillOp) else op.dst_piece) for _, op in ws))  # fmt: skip
    if key in proved:
        return 1
    frame = LocalFrame(st)
    hits = [frame.covers(op) for _, op in ws]
    wrong = z3.Or(*[frame.misplaced(op) for _, op in ws], z3.BoolVal(False))
    count = z3.Sum(*[z3.If(h, 1, 0) for h in hits], z3.IntVal(0))
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(frame.domain, *frame.decode, z3.Or(count != 1, wrong))
    if region is not None:
        solver.add(frame.in_piece(region) if region >= 0 else z3.Not(frame.in_any_piece()))
    model = _solve(solver, "cover", st, device)
    if model is None:
        proved.add(key)
        return 1
    x = frame.point(model)
    writers = [ws[k] for k, h in enumerate(hits) if z3.is_true(model.eval(h, model_completion=True))]
    why = "misplaced" if len(writers) == 1 else f"{len(writers)} writes"
    lines = "".join(f"\n  {describe(i, op)}" for i, op in writers)
    raise CertificateError(
        f"dst {st.id!r} on device {device}: local index {x} is covered by {why}{lines}",
        st.id,
        device,
        x,
        [i for i, _ in writers],
    )
