"""`compile_plan`: src PTC + dst PTC -> verified, frozen `Plan`.

Pipeline: place-ranks (optional) → lower (diff onto an op graph) → select-sources → coalesce
→ schedule → freeze with stats → `check_plan`. Pure and deterministic: no I/O, no clocks, no
randomness; the same inputs give byte-identical plan JSON.
"""

from __future__ import annotations

from collections import Counter

from tenplex.compiler.cost import host_lower_bounds, lower_bound_seconds, predict_seconds, round_loads
from tenplex.compiler.nogc import without_gc
from tenplex.compiler.ops import FillOp
from tenplex.compiler.passes.coalesce import Coalesce
from tenplex.compiler.passes.lower import Lower
from tenplex.compiler.passes.place_ranks import PlaceRanks
from tenplex.compiler.passes.schedule import Schedule
from tenplex.compiler.passes.select_sources import SelectSources
from tenplex.compiler.plan import CompileOptions, Plan, Stats, trusted_plan
from tenplex.compiler.program import Pass, Program, run_passes
from tenplex.compiler.verify import check_plan
from tenplex.ir.errors import CompileError
from tenplex.ir.ptc import PTC


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
    """Number the ops, attach stats, and freeze the plan."""
    graph = program.graph
    ops = graph.ops()
    if graph.keys() != tuple(range(len(ops))):
        raise CompileError("op graph keys are not 0..n-1 in insertion order")  # passes only add nodes
    edges = tuple(sorted((a, b) for a, b, _ in graph.edges()))
    messages = program.messages
    return trusted_plan(ops, edges, messages, program.dst.allocation, program.options, _stats(program, ops, messages))


def _stats(program: Program, ops, messages) -> Stats:
    """Bytes per link class and the cost model's per-round loads, from the messages (network
    messages by their byte counts, local ones op by op); `check_plan` recounts them from ops."""
    size = program.dst.itemsizes
    fill = sum(op.box.volume * size[program.dst.subtensor_map[op.dst_subtensor].tensor] for op in ops if isinstance(op, FillOp))
    loads = round_loads(ops, messages, size)
    by_class: Counter[str] = Counter()
    for load in loads.values():
        for (link, _, end), nbytes in load.items():
            if end != "in":  # a network message counts once, at its sender
                by_class[link] += nbytes
    per_host = program.lower_bounds if program.lower_bounds is not None else host_lower_bounds(program.src, program.dst)
    return Stats(
        device_bytes=by_class["device"],
        host_bytes=by_class["host"],
        network_bytes=by_class["network"],
        fill_bytes=fill,
        network_lower_bound_bytes=sum(per_host.values()),
        predicted_seconds=predict_seconds((loads[r] for r in sorted(loads)), program.topology.links),
        lower_bound_seconds=lower_bound_seconds(per_host, program.topology),
        rounds=len(loads),
    )
