"""Parts 2 and 4 of the demo: a small GPT reconfigured step by step, executed in-process.

(2,2,1) -> (1,2,2) -> (4,1,1) on one host, then out to a second host: each plan compiled,
verified and executed by the numpy executor from `arange` sources, every byte compared with the
source tensors (`check_execution`). Part 4 writes the Graphviz DOT of the last plan to
`demo-out/plan.dot`, rendered to PNG when `dot` is on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from demo.paper import spec, tpd_text
from demo.printer import Printer
from tenplex.compiler import Plan, compile_plan
from tenplex.compiler.emit import human_bytes, to_dot, to_text
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.runtime.oracle import check_execution

SMALL_MODEL = "gpt-tiny:layers=8,hidden=256,heads=8,ffn=1024,vocab=4096"
SMALL_STEPS = (((2, 2, 1), "1x4"), ((1, 2, 2), "1x4"), ((4, 1, 1), "1x4"), ((4, 1, 2), "2x4"))
QUICK_MODEL = "gpt-tiny"


@attrs.frozen
class Step:
    src: tuple[tuple[int, int, int], str]
    dst: tuple[tuple[int, int, int], str]
    plan: Plan | None
    seconds: float
    checked_bytes: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.plan is not None
            and self.plan.stats.network_bytes == self.plan.stats.network_lower_bound_bytes
        )


def run_steps(model: str, steps: Sequence) -> tuple[list[Step], PTC, PTC]:
    """Reconfigure through `steps`; each step's src is the previous dst as the plan placed it.
    Returns the steps and the last step's (src, dst) PTCs."""
    out: list[Step] = []
    src = ptc_from_spec(spec(model, *steps[0]))
    last = (src, src)
    for before, after in zip(steps, steps[1:]):
        try:
            dst = ptc_from_spec(spec(model, *after))
            t0 = time.perf_counter()
            plan = compile_plan(src, dst)
            seconds = time.perf_counter() - t0
            state = check_execution(plan, src, dst)
        except TenplexError as e:
            out.append(Step(before, after, None, 0.0, error=f"{type(e).__name__}: {e}"))
            break
        out.append(Step(before, after, plan, seconds, sum(a.nbytes for a in state.arrays.values())))
        last, src = (src, dst), dst.with_allocation(plan.allocation)
    return out, *last


def steps_title(model: str) -> str:
    return f"2. {model}: reconfigured, executed in-process, checked against the source"


def show_steps(p: Printer, steps: list[Step]) -> None:
    """Part 2's table (its title, `steps_title`, comes before the steps run)."""
    rows = []
    for s in steps:
        move = f"{tpd_text(s.src[0])}@{s.src[1]} -> {tpd_text(s.dst[0])}@{s.dst[1]}"
        if s.plan is None:
            rows.append([move, "FAILED", "", "", "", "", s.error[:60]])
            continue
        st = s.plan.stats
        rows.append([move, human_bytes(st.network_bytes), human_bytes(st.network_lower_bound_bytes),
                     human_bytes(st.host_bytes), human_bytes(st.device_bytes), f"{s.seconds:.2f} s",
                     f"ok, {human_bytes(s.checked_bytes)}" if s.ok else "MISMATCH"])  # fmt: skip
    p.table(["T,P,D @ hosts x GPUs", "network", "lower bound", "host", "same device", "compile+verify", "executed"],
            rows, align="lrrrrrl")  # fmt: skip


def write_dot(p: Printer, plan: Plan, src: PTC, dst: PTC, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "plan.dot"
    path.write_text(to_dot(plan, src, dst))
    p.line(f"  Graphviz DOT: wrote {path}")
    if shutil.which("dot") is None:
        p.line(f"  'dot' is not on PATH: PNG skipped (with graphviz: dot -Tpng {path} -o {path.with_suffix('.png')})")
        return
    png = path.with_suffix(".png")
    done = subprocess.run(["dot", "-Tpng", str(path), "-o", str(png)], capture_output=True, text=True)
    p.line(f"  rendered {png}" if done.returncode == 0 else f"  dot failed: {done.stderr.strip()[:200]}")


def show_last(p: Printer, step: Step, src: PTC, dst: PTC, out_dir: Path) -> None:
    """Part 4: the last plan of part 2, as text and as a Graphviz DOT file."""
    assert step.plan is not None
    move = f"{tpd_text(step.src[0])}@{step.src[1]} -> {tpd_text(step.dst[0])}@{step.dst[1]}"
    p.line(f"4. The last plan of part 2, {move}: its summary (to_text) and its Graphviz DOT", style="bold")
    p.line(to_text(step.plan, src, dst).rstrip())
    p.line()
    write_dot(p, step.plan, src, dst, out_dir)
