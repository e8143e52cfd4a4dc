"""`python -m demo` (`make demo`): tenplex end to end, in about a minute and a half on two cores.

1. `paper`: the paper's scale-up cases, tenplex's plans against the lower bound and the reference.
2. `steps`: a small GPT reconfigured step by step, executed in-process against the oracle.
3. `agents`: the same chain executed by two local agent processes over UCX.
4. `steps`: the Graphviz DOT of the last plan of part 2 in `demo-out/plan.dot`.
5. `hosts`: peer to peer vs the centralized baseline on emulated hosts (network namespaces).
6. `elastic`: an elastic training job under the controller, changing tp, pp and dp, with a crash.

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
from typing import TextIO

from demo.agents import AGENT_STEPS, AGENT_WORKERS, AgentStep, run_agent_steps, show_agents
from demo.paper import PAPER_DSTS, PAPER_MODELS, Case, pct_saved, run_cases, show_cases
from demo.printer import Printer
from demo.steps import QUICK_MODEL, SMALL_MODEL, SMALL_STEPS, Step, run_steps, show_last, show_steps
from tenplex.compiler.emit import human_bytes, human_seconds

HOSTS_MODEL = "gpt-tiny:layers=4,hidden=512,heads=8,ffn=2048,vocab=8192"
HOSTS_MOVES = (("(2,2,1)->(2,2,2)", "tp2,pp2,dp1@2x2", "tp2,pp2,dp2@4x2"),
               ("(2,2,1)->(2,4,1)", "tp2,pp2,dp1@2x2", "tp2,pp4,dp1@4x2"))  # fmt: skip


def headline(p: Printer, cases: list[Case], steps: list[Step], agents: list[AgentStep] | None = None,
             skipped: str = "") -> None:  # fmt: skip
    ok_cases = sum(c.ok for c in cases)
    ours, ref = sum(c.network for c in cases), sum(c.reference for c in cases)
    ok_steps = sum(s.ok for s in steps)
    checked = sum(s.checked_bytes for s in steps)
    p.line("tenplex demo: verified, minimal reconfiguration plans", style="bold")
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
    with p.status(f"compiling {len(models) * len(dsts)} paper cases and the small GPT ..."):
        cases = run_cases(models, dsts, args.jobs)
        steps, src, dst = run_steps(small, SMALL_STEPS)
    with p.status(f"executing {len(AGENT_STEPS) - 1} reconfigurations on {AGENT_WORKERS} local agents ..."):
        agents, skipped = run_agent_steps(small, AGENT_STEPS)
    hosts, hosts_skipped = [], "not in --quick"
    elastic, elastic_why = None, "not in --quick"
    if not args.quick:
        from demo.elastic import run_elastic
        from demo.hosts import run_hosts

        with p.status("emulated hosts: peer-to-peer vs central over shaped links ..."):
            hosts, hosts_skipped = run_hosts(HOSTS_MODEL, HOSTS_MOVES)
        with p.status("an elastic job on 2 -> 1 -> 2 -> 2 -> 1 processes (tp, pp, dp, a crash) ..."):
            elastic, elastic_why = run_elastic()
    headline(p, cases, steps, agents, skipped)
    p.line()
    show_cases(p, cases)
    p.line()
    show_steps(p, small, steps)
    p.line()
    show_agents(p, small, agents, skipped)
    p.line()
    from demo.hosts import hosts_ok, show_hosts

    show_hosts(p, HOSTS_MODEL, hosts, hosts_skipped)
    if steps[-1].plan is not None:
        p.line()
        show_last(p, steps[-1], src, dst, args.out)
    if not args.quick:
        from demo.elastic import show_elastic

        p.line()
        show_elastic(p, elastic, elastic_why)
    ok = all(c.ok for c in cases) and all(s.ok for s in steps) and len(steps) == len(SMALL_STEPS) - 1
    ok = ok and (bool(skipped) or (all(a.ok for a in agents) and len(agents) == len(AGENT_STEPS) - 1))
    ok = ok and hosts_ok(hosts, hosts_skipped)
    if not args.quick:
        from demo.elastic import elastic_ok

        ok = ok and elastic_ok(elastic, elastic_why)
    p.line()
    p.line(
        f"demo {'OK' if ok else 'FAILED'} in {human_seconds(time.perf_counter() - t0)}",
        style="bold green" if ok else "bold red",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
