"""`tenplex compile` and `tenplex verify`: plans from two PTCs or specs, and their proofs.

    tenplex compile SRC DST [--emit json|dot|text] [-o FILE] [--no-place-ranks]
                    [--max-message-bytes N] [--memory-budget N] [--baseline reference]
    tenplex verify PLAN SRC DST [--z3] [--execute-limit N]

SRC and DST are PTC JSON files (`"format": "tenplex.ptc/1"`), JSON spec files, or compact model
specs such as `gpt-1.3b:tp2,pp2,dp2@4x4`. Sizes accept `65536`, `64KiB`, `1GiB`.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from pathlib import Path

import click

from tenplex.cli.common import SIZE, load_state, write_output
from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, load_plan
from tenplex.compiler.emit import EMITTERS, human_bytes, plural
from tenplex.ir.ptc import PTC

EXECUTE_LIMIT = 256 << 20


def _placement_note(plan: Plan, dst: PTC) -> None:
    moved = sum(plan.allocation.mapping[pid] != devs for pid, devs in dst.allocation.items)
    if moved:
        click.echo(f"tenplex: note: place-ranks put {moved} of {len(dst.partitions)} partitions on other devices "
                   "than DST; launch each rank where the plan's allocation puts it", err=True)  # fmt: skip


@click.command("compile")
@click.argument("src")
@click.argument("dst")
@click.option("--emit", type=click.Choice(sorted(EMITTERS)), default="json", show_default=True, help="Output format.")
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@click.option(
    "--place-ranks/--no-place-ranks",
    default=True,
    show_default=True,
    help="Permute dst ranks over dst devices to keep data in place.",
)
@click.option("--max-message-bytes", type=SIZE, help="Largest coalesced message (default 64MiB).")
@click.option("--memory-budget", type=SIZE, help="Peak buffer bytes per host and round (default 1GiB).")
@click.option(
    "--baseline",
    type=click.Choice(["reference"]),
    help="Choose sources as the reference Tenplex does (for comparison).",
)
def compile_cmd(src: str, dst: str, emit: str, output: str | None, place_ranks: bool,
                max_message_bytes: int | None, memory_budget: int | None, baseline: str | None) -> None:  # fmt: skip
    """Compile the plan that turns SRC's state into DST's."""
    sizes = {"max_message_bytes": max_message_bytes, "memory_budget_bytes": memory_budget}
    options = CompileOptions(
        place_ranks=place_ranks, baseline=baseline, **{k: v for k, v in sizes.items() if v is not None}
    )
    src_ptc, dst_ptc = load_state(src), load_state(dst)
    plan = compile_plan(src_ptc, dst_ptc, options)
    text = EMITTERS[emit](plan, src_ptc, dst_ptc)
    write_output(text, output)
    _placement_note(plan, dst_ptc)


def _state_bytes(ptc: PTC) -> int:
    return sum(ptc.nbytes_of(st) * len(ptc.devices_of_subtensor(st.id)) for st in ptc.subtensors)


def _execution_bytes(src: PTC, dst: PTC) -> int:
    """What the in-process run holds at once: the global arange tensors (and the int64 arange
    of the largest), every src and dst instance."""
    tensors = sum(t.nbytes for t in src.tensors)
    arange = max((math.prod(t.shape) * 8 for t in src.tensors), default=0)
    return tensors + arange + _state_bytes(src) + _state_bytes(dst)


def available_memory() -> int | None:
    """Bytes this process may still allocate: Linux's MemAvailable, capped by a cgroup v2 memory
    limit; None when the system does not say."""
    avail = None
    with contextlib.suppress(OSError, ValueError, TypeError):
        avail = int(re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)[1]) * 1024  # type: ignore[index]
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int((cgroup / "memory.current").read_text())
            avail = room if avail is None else min(avail, room)
    return avail


def _execute(plan: Plan, src: PTC, dst: PTC, limit: int) -> str:
    """Run the plan against the arange oracle when the dst state is within `limit` and the run
    fits in memory; otherwise say why it was skipped (`check_plan` has already proved it)."""
    size = _state_bytes(dst)
    if size > limit:
        return f"execution: skipped (dst state {human_bytes(size)} exceeds --execute-limit {human_bytes(limit)})"
    need, avail = _execution_bytes(src, dst), available_memory()
    if avail is not None and need > avail:
        return f"execution: skipped (the in-process run needs about {human_bytes(need)} of memory; {human_bytes(avail)} available)"
    from tenplex.runtime import oracle

    try:
        oracle.check_execution(plan, src, dst)
    except MemoryError:
        return f"execution: skipped (ran out of memory; the in-process run needs about {human_bytes(need)})"
    return f"execution: ok (in-process on arange sources, {human_bytes(size)} of dst state equal to the oracle byte for byte)"


def _certify(plan: Plan, src: PTC, dst: PTC) -> str:
    try:
        import z3  # noqa: F401
    except ImportError:
        raise click.ClickException("--z3 needs the z3-solver package (pip install z3-solver)") from None
    root = str(Path(__file__).resolve().parents[2])
    if (Path(root) / "proofs").is_dir() and root not in sys.path:
        sys.path.append(root)  # proofs/ lives beside tenplex/ in a source checkout
    try:
        from proofs.certificate import CertificateError, certify
    except ImportError as e:
        raise click.ClickException(f"--z3 needs proofs.certificate from a tenplex source checkout ({e})") from None
    try:
        cert = certify(plan, src, dst)
    except CertificateError as e:
        raise click.ClickException(f"z3 certificate failed: {e}") from None
    return (f"z3 certificate: ok ({plural(len(cert.instances), 'dst instance')}, {cert.queries} unsat queries, "
            f"{cert.seconds:.2f} s)")  # fmt: skip


@click.command()
@click.argument("plan", type=click.Path(dir_okay=False))
@click.argument("src")
@click.argument("dst")
@click.option(
    "--z3", "use_z3", is_flag=True, help="Also certify the exact cover with z3 (needs proofs/ and z3-solver)."
)
@click.option("--execute-limit", type=SIZE, default=EXECUTE_LIMIT,
              help="Execute the plan in-process against the arange oracle when the dst state is at most this big (default 256MiB) "
                   "and the run fits in the memory available.")  # fmt: skip
def verify(plan: str, src: str, dst: str, use_z3: bool, execute_limit: int) -> None:
    """Check that PLAN turns SRC's state into DST's (exact cover, messages, stats), and run it
    against the arange oracle when the state is small."""
    the_plan = load_plan(plan)
    src_ptc, dst_ptc = load_state(src), load_state(dst)
    check_plan(the_plan, src_ptc, dst_ptc)
    lines = ["exact cover: ok (check_plan: every dst element written once, messages and stats consistent)"]
    lines.append(_execute(the_plan, src_ptc, dst_ptc, execute_limit))
    if use_z3:
        lines.append(_certify(the_plan, src_ptc, dst_ptc))
    s = the_plan.stats
    lines.append(f"plan verified: {plural(len(the_plan.ops), 'op')}, {plural(len(the_plan.messages), 'message')} in {plural(s.rounds, 'round')}; "
                 f"network {human_bytes(s.network_bytes)} (lower bound {human_bytes(s.network_lower_bound_bytes)})")  # fmt: skip
    click.echo("\n".join(lines))
