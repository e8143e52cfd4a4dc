"""z3 certificate that a plan's network traffic meets the per-host lower bound.

For every (dst host, tensor), with a symbolic global point g, this query must be unsat:
g is brought into the host by two or more network copies, or by a network copy although a
src piece on a device of that host already holds g.

With the exact cover of `proofs.certificate` (each needed element arrives at least once, from
a holder), this proves that each host receives over the network exactly the elements its dst
devices need and no src device of the host holds, each once: network bytes equal the lower
bound of docs/design.md §9. Forward copies (`src_side="dst"`) stay inside a host and are not network.

Raises CertificateError with the point, the host and the copies.
"""

from __future__ import annotations

import time
from collections import defaultdict

import attrs
import z3

from tenplex.compiler.ops import CopyOp
from tenplex.compiler.plan import Plan
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC
from tenplex.proofs.certificate import CertificateError
from tenplex.proofs.encode import describe, in_box, int_vector


@attrs.frozen
class NetworkProof:
    hosts: int
    queries: int
    network_copies: int
    seconds: float


def certify_network(plan: Plan, src: PTC, dst: PTC, timeout_ms: int = 10_000) -> NetworkProof:
    """Prove each element enters each host over the network at most once, and only when no src
    device of the host holds it. Raises CertificateError."""
    t0 = time.perf_counter()
    topo = src.topology.union(dst.topology)
    incoming: dict[tuple[str, str], list[tuple[int, CopyOp]]] = defaultdict(list)
    for i, op in enumerate(plan.ops):
        if isinstance(op, CopyOp) and topo.host_of(op.src_device) != topo.host_of(op.dst_device):
            incoming[(topo.host_of(op.dst_device), op.tensor)].append((i, op))
    for (host, tensor), copies in sorted(incoming.items()):
        local = [
            p.global_box
            for st in src.by_tensor.get(tensor, ())
            for p in st.pieces
            if any(topo.host_of(d) == host for d in src.devices_of_subtensor(st.id))
        ]
        _prove_host(host, tensor, copies, local, timeout_ms)
    hosts = len({h for h, _ in incoming})
    return NetworkProof(hosts, len(incoming), sum(len(c) for c in incoming.values()), time.perf_counter() - t0)


def _prove_host(host: str, tensor: str, copies: list[tuple[int, CopyOp]], local: list[Box], timeout_ms: int) -> None:
    g = int_vector("g", copies[0][1].box.ndim)
    hits = [in_box(g, op.box) for _, op in copies]
    held = z3.Or(*[in_box(g, b) for b in local], z3.BoolVal(False))
    count = z3.Sum(*[z3.If(h, 1, 0) for h in hits], z3.IntVal(0))
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(z3.Or(count >= 2, z3.And(count >= 1, held)))
    result = solver.check()
    if result == z3.unknown:
        raise CertificateError(
            f"network query for host {host} tensor {tensor!r} is unknown ({solver.reason_unknown()})"
        )
    if result == z3.unsat:
        return
    model = solver.model()
    point = tuple(model.eval(v, model_completion=True).as_long() for v in g)
    writers = [copies[k] for k, h in enumerate(hits) if z3.is_true(model.eval(h, model_completion=True))]
    why = (
        "is already held on the host"
        if z3.is_true(model.eval(held, model_completion=True))
        else f"arrives {len(writers)} times"
    )
    lines = "".join(f"\n  {describe(i, op)} to device {op.dst_device}" for i, op in writers)
    raise CertificateError(
        f"host {host}: element {point} of tensor {tensor!r} crosses the network but {why}{lines}",
        index=point,
        writers=[i for i, _ in writers],
    )
