"""`compile_plan`: src PTC + dst PTC -> verified, frozen `Plan`.

Pipeline: place-ranks (optional) → lower (diff onto an op graph) → select-sources → coalesce
→ schedule → freeze with stats → `check_plan`. Pure and deterministic: no I/O, no clocks, no
randomness; the same inputs give byte-identical plan JSON.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter

import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.cost import Held, host_lower_bounds, lower_bound_seconds
from tenplex.compiler.nogc import without_gc
from tenplex.compiler.ops import FillOp
from tenplex.compiler.passes.coalesce import Coalesce
from tenplex.compiler.passes.lower import Lower
from tenplex.compiler.passes.place_ranks import PlaceRanks
from tenplex.compiler.passes.schedule import Schedule
from tenplex.compiler.passes.select_sources import SelectSources
from tenplex.compiler.plan import CompileOptions, Plan, Stats, trusted_plan
from tenplex.compiler.program import Pass, Program, run_passes
from tenplex.compiler.table import PlanMessages, PlanOps
from tenplex.compiler.verify import check_plan
from tenplex.compiler.verify.tables import group_sum
from tenplex.ir.ptc import PTC

_ID = attrgetter("id")


def default_passes(options: CompileOptions) -> list[Pass]:
    first: list[Pass] = [PlaceRanks()] if options.place_ranks and options.baseline is None else []
    return first + [Lower(), SelectSources(), Coalesce(), Schedule()]


@without_gc
def compile_plan(src: PTC, dst: PTC, options: CompileOptions | None = None) -> Plan:
    """Raises CompileError when dst cannot be built from src; PlanVerifyError on a compiler bug."""
    options = options or CompileOptions()
    program = run_passes(Program.start(src, dst, options), default_passes(options))
    plan = freeze(program)
    check_plan(plan, src, dst)
    return plan


@without_gc
def freeze(program: Program) -> Plan:
    """Attach stats and freeze the plan: its ops and messages stay the passes' columns
    (`Plan.ops` and `Plan.messages` build their objects when first read)."""
    t, m = program.table, program.messages
    e = program.edges
    order = keysort.lexsort((e[:, 1], e[:, 0]))
    edges = tuple(zip(e[order, 0].tolist(), e[order, 1].tolist()))
    return trusted_plan(PlanOps(t), edges, PlanMessages(m), program.dst.allocation, program.options, _stats(program))


def _stats(program: Program) -> Stats:
    """Bytes per link class and the cost model's per-round loads (`cost.round_loads` and
    `cost.predict_seconds` on columns, the same sums and floats): network messages by their
    byte counts, local ones copy by copy; `check_plan` recounts them."""
    t, m, dst = program.table, program.messages, program.dst
    size = dst.itemsizes
    fill = sum(op.box.volume * size[_tensor_of(dst, op.dst_subtensor)] for _, op in t.others if isinstance(op, FillOp))
    nbytes = t.volume * np.array([size[name] for name in t.tensors], np.int64)[t.tensor]
    row = np.full(t.n, -1, np.int64)
    row[t.copy_at] = np.arange(len(t.copy_at))
    net = m.src != m.dst
    local_op = np.repeat(~net, m.lens)
    local = row[m.ops[local_op]]
    rounds = np.repeat(m.round, m.lens)[local_op]
    link = np.where(t.src_dev[local] == t.dst_dev[local], 2, 3)  # device, host
    w = max(len(m.hosts), int(t.dst_dev.max(initial=0)) + 1)
    keys = np.concatenate(((m.round[net] * 4) * w + m.src[net], (m.round[net] * 4 + 1) * w + m.dst[net],
                           (rounds * 4 + link) * w + t.dst_dev[local]))  # fmt: skip
    uk, sums = group_sum(keys, np.concatenate((m.bytes[net], m.bytes[net], nbytes[local])))
    links = program.topology.links
    per_host = program.lower_bounds
    if per_host is None:  # no rank placement: the bounds from the piece boxes `Program.start` read (`Held`)
        per_host = host_lower_bounds(program.src, dst, held=Held(program.pieces))
    return Stats(
        device_bytes=int(nbytes[local[link == 2]].sum()),
        host_bytes=int(nbytes[local[link == 3]].sum()),
        network_bytes=int(m.bytes[net].sum()),
        fill_bytes=fill,
        network_lower_bound_bytes=sum(per_host.values()),
        predicted_seconds=_predicted(uk, sums, w, (links.network, links.network, links.device, links.host)),
        lower_bound_seconds=lower_bound_seconds(per_host, program.topology),
        rounds=len(keysort.unique(m.round)),
    )


def _tensor_of(ptc: PTC, sid: str) -> str:
    """The tensor of sub-tensor `sid`, by bisection (a PTC keeps its sub-tensors sorted by id):
    the few fills need no map of all 37k sub-tensors (~0.01 CPU s at 1024 GPUs)."""
    sts = ptc.subtensors
    i = bisect_left(sts, sid, key=_ID)
    if i == len(sts) or sts[i].id != sid:
        return ptc.subtensor_map[sid].tensor  # raises KeyError as the map did
    return sts[i].tensor


def _predicted(uk: np.ndarray, sums: np.ndarray, w: int, bw: tuple) -> float:
    """Sum over rounds (ascending) of the slowest link end's bytes / bandwidth: keys `uk`
    (sorted; round * 4 + link class, times `w`, plus the end) with their byte `sums`. Divided
    by numpy where both sides are exact doubles (the same IEEE quotient as Python's `/`),
    else one at a time in Python."""
    if not len(uk):
        return 0
    kind, rounds = (uk // w) % 4, uk // (4 * w)
    exact = int(sums.max()) < 2**53 and all(type(b) is float or (type(b) is int and b < 2**53) for b in bw)
    if exact:
        seconds = sums / np.array(bw, np.float64)[kind]
    else:
        seconds = np.array([b / bw[k] for b, k in zip(sums.tolist(), kind.tolist())], np.float64)
    return sum(np.maximum.reduceat(seconds, keysort.starts(rounds)).tolist())
