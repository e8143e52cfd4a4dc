"""`python -m demo` (`make demo`): tenplex end to end, in about a minute and a half on two cores.

1. `paper`: the paper's scale-up cases, tenplex's plans against the lower bound and the reference.
2. `steps`: a small GPT reconfigured step by step, executed in-process against the oracle.
3. `agents`: the first two steps of that chain executed by two local agent processes over UCX.
4. `steps`: the last plan of part 2 as text, and its Graphviz DOT in `demo-out/plan.dot`.
5. `hosts`: peer to peer vs the centralized baseline on emulated hosts (network namespaces).
6. `elastic`: an elastic training job under the controller, changing tp, pp and dp, with a crash.
7. `elastic`: the same job across emulated hosts, scaling out and losing a host.

Each part prints its title before it runs (a spinner on a terminal while it does), then its
table; the summary of all parts comes last. Nothing else prints while a part runs.

Exit status 0 when every plan verifies, moves exactly the network lower bound, and executes to
the oracle byte for byte; 1 otherwise (the failing case is named in the output). `--quick` runs
parts 1-4 on one paper case and the tiny GPT (for tests).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from demo.agents import AGENT_STEPS, AGENT_WORKERS, AgentStep, agents_title, run_agent_steps, show_agents
from demo.elastic import elastic_ok, elastic_title, hosts_elastic_title, show_elastic
from demo.hosts import hosts_ok, hosts_title, show_hosts
from demo.paper import PAPER_DSTS, PAPER_MODELS, Case, cases_title, pct_saved, run_cases, show_cases
from demo.printer import Printer
from demo.steps import QUICK_MODEL, SMALL_MODEL, SMALL_STEPS, Step, run_steps, show_last, show_steps, steps_title
from tenplex.compiler.emit import human_bytes, human_seconds

HOSTS_MODEL = "gpt-tiny:layers=4,hidden=512,heads=8,ffn=2048,vocab=8192"
HOSTS_MOVES = (("(2,2,1)->(2,2,2)", "tp2,pp2,dp1@2x2", "tp2,pp2,dp2@4x2"),
               ("(2,2,1)->(2,4,1)", "tp2,pp2,dp1@2x2", "tp2,pp4,dp1@4x2"))  # fmt: skip


TITLE = "tenplex demo: verified, minimal reconfiguration plans"


def headline(p: Printer, cases: list[Case], steps: list[Step], agents: list[AgentStep] | None = None,
             skipped: str = "", elastic: dict[str, Any] | None = None, across: dict[str, Any] | None = None) -> None:  # fmt: skip
    """The summary of every part that ran, printed last."""
    ok_cases = sum(c.ok for c in cases)
    ours, ref = sum(c.network for c in cases), sum(c.reference for c in cases)
    ok_steps = sum(s.ok for s in steps)
    checked = sum(s.checked_bytes for s in steps)
    p.line("Summary", style="bold")
    p.line(f"  paper cases: {ok_cases}/{len(cases)} plans verified at the network lower bound; "
           f"{human_bytes(ours)} over the network vs {human_bytes(ref)} for reference Tenplex ({pct_saved(ours, ref)} less)")  # fmt: skip
    p.line(f"  small GPT:   {ok_steps}/{len(steps)} reconfigurations executed in-process, "
           f"{human_bytes(checked)} of dst state equal to the source byte for byte")  # fmt: skip
    if skipped:
        p.line(f"  agents:      skipped (ucxx cannot be imported: {skipped})")
    elif agents is not None:
        moved, secs = sum(a.moved for a in agents), sum(a.seconds for a in agents)
        p.line(f"  agents:      {sum(a.ok for a in agents)}/{len(AGENT_STEPS) - 1} reconfigurations executed by "
               f"{AGENT_WORKERS} agent processes over UCX, {human_bytes(moved)} moved in {human_seconds(secs)}, "
               f"dst state equal to the source byte for byte")  # fmt: skip
    if elastic is not None:
        same = "the same samples" if elastic["same_samples_every_step"] else "DIFFERENT samples"
        p.line(f"  elastic job: {len(elastic['reconfigurations'])} reconfigurations of a training job, max relative loss "
               f"difference {elastic['max_rel_loss_diff']:.1g} vs a static run, {same} every step")  # fmt: skip
    if across is not None:
        same = "the same samples" if across["same_samples_every_step"] else "DIFFERENT samples"
        p.line(f"  across hosts: {len(across['reconfigurations'])} reconfigurations on 3 emulated hosts, one lost, max "
               f"relative loss difference {across['max_rel_loss_diff']:.1g} vs a static run, {same} every step")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one paper case and gpt-tiny (for tests)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes for the paper cases")
    ap.add_argument("--out", type=Path, default=Path("demo-out"), help="where plan.dot goes (default demo-out)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> int:
    args = parse_args(argv)
    p = Printer(stream or sys.stdout)
    models, dsts = (PAPER_MODELS[:1], PAPER_DSTS[:1]) if args.quick else (PAPER_MODELS, PAPER_DSTS)
    small = QUICK_MODEL if args.quick else SMALL_MODEL
    t0 = time.perf_counter()
    p.line(TITLE, style="bold")
    p.line()
    p.line(cases_title(len(models) * len(dsts)), style="bold")  # each part: its title, then it runs
    with p.status(f"compiling {len(models) * len(dsts)} paper cases ..."):
        cases = run_cases(models, dsts, args.jobs)
    show_cases(p, cases)
    p.line()
    p.line(steps_title(small), style="bold")
    with p.status("compiling and executing the small GPT's reconfigurations ..."):
        steps, src, dst = run_steps(small, SMALL_STEPS)
    show_steps(p, steps)
    p.line()
    p.line(agents_title(small), style="bold")
    with p.status(f"executing {len(AGENT_STEPS) - 1} reconfigurations on {AGENT_WORKERS} local agents ..."):
        agents, skipped = run_agent_steps(small, AGENT_STEPS)
    show_agents(p, agents, skipped)
    if steps[-1].plan is not None:
        p.line()
        show_last(p, steps[-1], src, dst, args.out)
    p.line()
    hosts, hosts_skipped, elastic, elastic_why = run_late_parts(p, args.quick)
    p.line()
    p.line(hosts_elastic_title(), style="bold")
    across, across_why = None, "not in --quick"
    if not args.quick:
        from demo.elastic import run_elastic_hosts

        with p.status("an elastic job across 3 emulated hosts, one of them lost, and a static run ..."):
            across, across_why = run_elastic_hosts()
    show_elastic(p, across, across_why)
    p.line()
    headline(p, cases, steps, agents, skipped, elastic, across)
    ok = all(c.ok for c in cases) and all(s.ok for s in steps) and len(steps) == len(SMALL_STEPS) - 1
    ok = ok and (bool(skipped) or (all(a.ok for a in agents) and len(agents) == len(AGENT_STEPS) - 1))
    ok = ok and hosts_ok(hosts, hosts_skipped) and (args.quick or (elastic_ok(elastic, elastic_why) and elastic_ok(across, across_why)))
    p.line()
    p.line(
        f"demo {'OK' if ok else 'FAILED'} in {human_seconds(time.perf_counter() - t0)}",
        style="bold green" if ok else "bold red",
    )
    return 0 if ok else 1


def run_late_parts(p: Printer, quick: bool) -> tuple[list[dict[str, Any]], str, dict[str, Any] | None, str]:
    """Parts 5 (emulated hosts) and 6 (an elastic job), each title before it runs; `quick`
    skips both. Returns (hosts rows, why hosts were skipped, the elastic result, why not)."""
    p.line(hosts_title(), style="bold")
    hosts, hosts_skipped = [], "not in --quick"
    if not quick:
        from demo.hosts import run_hosts

        with p.status("emulated hosts: peer-to-peer vs central over shaped links ..."):
            hosts, hosts_skipped = run_hosts(HOSTS_MODEL, HOSTS_MOVES)
    show_hosts(p, HOSTS_MODEL, hosts, hosts_skipped)
    p.line()
    p.line(elastic_title(), style="bold")
    elastic, elastic_why = None, "not in --quick"
    if not quick:
        from demo.elastic import run_elastic

        with p.status("an elastic job on 2 -> 1 -> 2 -> 2 -> 1 processes (tp, pp, dp, a crash), and a static run ..."):
            elastic, elastic_why = run_elastic()
    show_elastic(p, elastic, elastic_why)
    return hosts, hosts_skipped, elastic, elastic_why


if __name__ == "__main__":
    sys.exit(main())
