"""`make demo`'s elastic part: a real elastic job on local processes that scales down and up.

The example GPT (`examples/elastic_gpt.py`, DTensor TP x PP x DP over gloo) runs statically on 2
processes (tp 2) and, through the controller, on 2 -> 1 -> 2 -> 2 -> 1 processes (tp 2 -> one
process -> pp 2 -> dp 2 -> rank 1 crashes, the survivor carries on from its dp replica): each
reconfiguration stops the program at a step boundary, saves its DCP checkpoint, reshards it with
a verified plan and relaunches torchrun. Printed: each reconfiguration's phases, and the loss of
both runs step by step with the largest difference.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tenplex.ir.errors import TenplexError

STEPS = 10
PROGRAM_ARGS = ["--samples", "64", "--layers", "2"]


def run_elastic() -> tuple[dict[str, Any] | None, str]:
    """(the comparison, "") or (None, why it was skipped or failed)."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    from demo.convergence import DEMO, compare

    work = Path(tempfile.mkdtemp(prefix="tenplex-demo-elastic-"))
    try:
        return compare(work, STEPS, PROGRAM_ARGS, DEMO, out=lambda _: None), ""  # the table says it all
    except (TenplexError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


HOSTS_STEPS = 8
HOSTS_ARGS = ["--samples", "48", "--global-batch", "12", "--micro-batch", "2", "--layers", "2"]


def run_elastic_hosts() -> tuple[dict[str, Any] | None, str]:
    """Part 7: the example across 3 emulated hosts, 2 -> 3 hosts at step 2, then host h2 lost once
    step 5 ran (every process of it killed): (the comparison, "") or (None, why not)."""
    from tenplex.runtime.netns import netns_unavailable_reason

    if (reason := netns_unavailable_reason()) is not None:
        return None, f"network namespaces unavailable: {reason}"
    try:
        import torch.distributed  # noqa: F401
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    from demo.convergence import Scenario, compare

    scenario = Scenario(2, {"2": [2, 1, 1], "3": [1, 1, 3]}, ((0.25, {"devices": 3}),))
    work = Path(tempfile.mkdtemp(prefix="tenplex-demo-hosts-"))
    try:
        return compare(work, HOSTS_STEPS, HOSTS_ARGS, scenario, out=lambda _: None, hosts=3, lose=(2, 5)), ""
    except (TenplexError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def hosts_elastic_title() -> str:
    return ("7. Elastic job across 3 emulated hosts (an agent, a torchrun node and a directory each): 2 -> 3 hosts, "
            "then host h2 lost mid-generation, vs a static run")  # fmt: skip


def elastic_title() -> str:
    return ("6. Elastic job: the example GPT (DTensor TP x PP x DP, gloo) on 2 -> 1 -> 2 -> 2 -> 1 processes, a crash "
            "included, vs a static run")  # fmt: skip


def show_elastic(p: Any, result: dict[str, Any] | None, why: str) -> None:
    """The elastic run's reconfigurations and both runs' losses (its title, `elastic_title`, comes first)."""
    if result is None:
        p.line(f"  skipped: {why}")
        return
    for rec in result["reconfigurations"]:
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in rec["phases"].items())
        failed = f" after rank(s) {rec['failed']} crashed, from {rec['recovered_from']}" if rec["failed"] else ""
        p.line(f"  step {rec['step']}: {_layout(rec['src'])} -> {_layout(rec['dst'])}{failed}: {phases}")
    rows = [[a["step"], f"{a['W']} {_layout(a)}", f"{a['loss']:.6f}", f"{b['W']} {_layout(b)}", f"{b['loss']:.6f}",
             f"{abs(a['loss'] - b['loss']):.1e}"] for a, b in zip(result["static"], result["elastic"])]  # fmt: skip
    p.table(("step", "static W", "loss", "elastic W", "loss", "|diff|"), rows, "rlrlrr")
    same = "identical" if result["same_samples_every_step"] else "DIFFERENT"
    p.line(f"  max |loss difference| {result['max_abs_loss_diff']:.2g} (relative {result['max_rel_loss_diff']:.2g}); "
           f"samples read per step: {same}")  # fmt: skip


def elastic_ok(result: dict[str, Any] | None, why: str) -> bool:
    if result is None:
        return why.startswith(("torch is not installed", "network namespaces unavailable"))
    return result["same_samples_every_step"] and result["max_rel_loss_diff"] < 1e-4


def _layout(c: dict[str, int]) -> str:
    pp = c.get("pp", 1)
    return f"(tp{c['tp']},dp{c['dp']}" + (f",pp{pp})" if pp > 1 else ")")
