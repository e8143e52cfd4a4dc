"""`tenplex compile` and `tenplex verify`: plans from two PTCs or specs, and their proofs.

    tenplex compile SRC DST [--emit json|dot|text|svg|png] [-o FILE] [--no-place-ranks]
                    [--max-message-bytes N] [--memory-budget N] [--baseline reference]
    tenplex verify PLAN SRC DST [--z3] [--execute-limit N] [--json]

SRC and DST are PTC JSON files (`"format": "tenplex.ptc/1"`), JSON spec files, or compact model
specs such as `gpt-1.3b:tp2,pp2,dp2@4x4`. Sizes accept `65536`, `64KiB`, `1GiB`. `--emit png`
needs `-o FILE` (an image is not for a terminal); svg and png need matplotlib.

A plan that fails verification (the exact cover, the run against the arange oracle, or the z3
certificate) raises PlanVerifyError, one line naming what failed; with `--json`, stdout first
gets `{"ok": false, "failed": ..., "error": ...}`. Long work (compiling, drawing, verifying)
shows a spinner on stderr, only when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from tenplex.cli.common import SIZE, echo_json, load_state, log, write_output
from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, load_plan
from tenplex.compiler.emit import BINARY, EMITTERS, human_bytes, plural
from tenplex.ir.errors import ExecutionError, PlanVerifyError
from tenplex.ir.files import write_atomic
from tenplex.ir.ptc import PTC

EXECUTE_LIMIT = 256 << 20
VERIFY_FORMAT = "tenplex.verify/1"


def _console() -> Any:
    """A rich console on stderr when stderr is a terminal, else None."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def progress(first: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr saying what runs now; yields a function that changes the text. Quiet
    (the function does nothing) when stderr is not a terminal: in pipes, files and tests."""
    console = _console()
    if console is None:
        yield lambda text: None
        return
    with console.status(first) as status:
        yield status.update


def _placement_note(plan: Plan, dst: PTC) -> None:
    moved = sum(plan.allocation.mapping[pid] != devs for pid, devs in dst.allocation.items)
    if moved:
        log.info("note: place-ranks put %d of %d partitions on other devices than DST; launch each rank where the "
                 "plan's allocation puts it", moved, len(dst.partitions))  # fmt: skip


def _write_binary(data: bytes, output: str) -> None:
    """Write an image atomically (complete or absent), as `write_output` does for text."""
    try:
        write_atomic(output, data)
    except OSError as e:
        raise click.ClickException(f"{output}: cannot write: {e.strerror or e}") from None
    log.info("wrote %s (%s)", output, human_bytes(len(data)))


@click.command("compile")
@click.argument("src")
@click.argument("dst")
@click.option("--emit", type=click.Choice(sorted(EMITTERS)), default="json", show_default=True,
              help="Output format: a plan (json), Graphviz (dot), a summary (text), or a picture (svg, png: needs -o).")  # fmt: skip
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
    if emit in BINARY and output in (None, "-"):
        raise click.UsageError(f"--emit {emit} writes an image: give -o FILE")
    sizes = {"max_message_bytes": max_message_bytes, "memory_budget_bytes": memory_budget}
    options = CompileOptions(
        place_ranks=place_ranks, baseline=baseline, **{k: v for k, v in sizes.items() if v is not None}
    )
    with progress("reading SRC and DST") as say:
        src_ptc, dst_ptc = load_state(src), load_state(dst)
        say(f"compiling a plan for {plural(len(dst_ptc.topology.devices), 'device')}")
        plan = compile_plan(src_ptc, dst_ptc, options)
        say(f"writing the plan as {emit}")
        out = EMITTERS[emit](plan, src_ptc, dst_ptc)
    if isinstance(out, bytes):
        _write_binary(out, str(output))
    else:
        write_output(out, output)
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


def _execute(plan: Plan, src: PTC, dst: PTC, limit: int) -> dict[str, Any]:
    """Run the plan against the arange oracle when the dst state is within `limit` and the run
    fits in memory; otherwise say why it was skipped (`check_plan` has already proved it).
    Raises PlanVerifyError when the run's dst state differs from the oracle's."""
    size = _state_bytes(dst)
    if size > limit:
        return {"status": "skipped", "reason": "execute_limit", "dst_state_bytes": size, "limit_bytes": limit}
    need, avail = _execution_bytes(src, dst), available_memory()
    if avail is not None and need > avail:
        return {"status": "skipped", "reason": "memory", "needed_bytes": need, "available_bytes": avail}
    from tenplex.runtime import oracle

    try:
        oracle.check_execution(plan, src, dst)
    except MemoryError:
        return {"status": "skipped", "reason": "out_of_memory", "needed_bytes": need}
    except ExecutionError as e:
        raise PlanVerifyError(f"execution on arange sources: {e}") from None
    return {"status": "ok", "dst_state_bytes": size}


def _execution_line(run: dict[str, Any]) -> str:
    if run["status"] == "ok":
        return (f"execution: ok (in-process on arange sources, {human_bytes(run['dst_state_bytes'])} of dst state "
                "equal to the oracle byte for byte)")  # fmt: skip
    if run["reason"] == "execute_limit":
        why = (
            f"dst state {human_bytes(run['dst_state_bytes'])} exceeds --execute-limit {human_bytes(run['limit_bytes'])}"
        )
    elif run["reason"] == "memory":
        why = (f"the in-process run needs about {human_bytes(run['needed_bytes'])} of memory; "
               f"{human_bytes(run['available_bytes'])} available")  # fmt: skip
    else:
        why = f"ran out of memory; the in-process run needs about {human_bytes(run['needed_bytes'])}"
    return f"execution: skipped ({why})"


def _certify(plan: Plan, src: PTC, dst: PTC) -> dict[str, Any]:
    """The z3 certificate's counts. Raises PlanVerifyError when z3 refutes the plan."""
    try:
        from tenplex.proofs.certificate import CertificateError, certify
    except ImportError as e:
        raise click.ClickException(f"--z3 needs the z3-solver package: pip install 'tenplex[proofs]' ({e})") from None
    try:
        cert = certify(plan, src, dst)
    except CertificateError as e:
        raise PlanVerifyError(f"z3 certificate failed: {e}") from None
    return {"status": "ok", "instances": len(cert.instances), "total_instances": cert.total_instances,
            "queries": cert.queries, "seconds": round(cert.seconds, 3)}  # fmt: skip


def _summary(plan: Plan) -> dict[str, Any]:
    kinds = {"copy": 0, "fill": 0, "value": 0}
    for op in plan.ops:
        kinds[op.kind] += 1
    network = sum(m.src_host != m.dst_host for m in plan.messages)
    s = plan.stats
    return {"ops": {"total": len(plan.ops), **kinds},
            "messages": {"total": len(plan.messages), "network": network, "local": len(plan.messages) - network},
            "rounds": s.rounds, "network_bytes": s.network_bytes, "network_lower_bound_bytes": s.network_lower_bound_bytes}  # fmt: skip


def _lines(facts: dict[str, Any]) -> list[str]:
    lines = ["exact cover: ok (check_plan: every dst element written once, messages and stats consistent)",
             _execution_line(facts["execution"])]  # fmt: skip
    if (z3 := facts["z3"]) is not None:
        lines.append(f"z3 certificate: ok ({plural(z3['instances'], 'dst instance')}, {z3['queries']} unsat queries, "
                     f"{z3['seconds']:.2f} s)")  # fmt: skip
    lines.append(f"plan verified: {plural(facts['ops']['total'], 'op')}, {plural(facts['messages']['total'], 'message')} "
                 f"in {plural(facts['rounds'], 'round')}; network {human_bytes(facts['network_bytes'])} "
                 f"(lower bound {human_bytes(facts['network_lower_bound_bytes'])})")  # fmt: skip
    return lines


@click.command()
@click.argument("plan", type=click.Path(dir_okay=False))
@click.argument("src")
@click.argument("dst")
@click.option("--z3", "use_z3", is_flag=True,
              help="Also certify the exact cover with z3 (needs z3-solver: pip install 'tenplex[proofs]').")  # fmt: skip
@click.option("--execute-limit", type=SIZE, default=EXECUTE_LIMIT,
              help="Execute the plan in-process against the arange oracle when the dst state is at most this big (default 256MiB) "
                   "and the run fits in the memory available.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help=f"Print one JSON object ({VERIFY_FORMAT}) with the same facts instead of text lines.")  # fmt: skip
def verify(plan: str, src: str, dst: str, use_z3: bool, execute_limit: int, as_json: bool) -> None:
    """Check that PLAN turns SRC's state into DST's (exact cover, messages, stats), and run it
    against the arange oracle when the state is small."""
    with progress("reading PLAN, SRC and DST") as say:
        the_plan = load_plan(plan)
        src_ptc, dst_ptc = load_state(src), load_state(dst)
        facts = _verified(the_plan, src_ptc, dst_ptc, use_z3, execute_limit, say, as_json)
    if as_json:
        echo_json({"format": VERIFY_FORMAT, **facts})
    else:
        click.echo("\n".join(_lines(facts)))


def _verified(plan: Plan, src: PTC, dst: PTC, use_z3: bool, limit: int, say: Callable[[str], None],
              as_json: bool) -> dict[str, Any]:  # fmt: skip
    """The facts `verify` prints, in its JSON form. Raises PlanVerifyError (after printing the
    failure as JSON with `as_json`) when a check refutes the plan."""
    stage = "exact cover"
    try:
        say("checking the exact cover")
        check_plan(plan, src, dst)
        stage = "execution"
        say("executing the plan on arange sources")
        facts = {"ok": True, "exact_cover": {"status": "ok"}, "execution": _execute(plan, src, dst, limit), "z3": None}
        stage = "z3 certificate"
        if use_z3:
            say("certifying the plan with z3 (one query per dst instance and check)")
            facts["z3"] = _certify(plan, src, dst)
    except PlanVerifyError as e:
        if as_json:
            echo_json({"format": VERIFY_FORMAT, "ok": False, "failed": stage, "error": str(e)})
        raise
    return facts | _summary(plan)
