"""Part 1 of the demo: the paper's scale-up cases.

GPT-3 XL / 2.7B / 6.7B at (T,P,D) = (4,2,1) on 2 hosts x 4 GPUs grown to 4 hosts x 4 GPUs at
(4,2,2), (4,4,1) and (8,2,1). Per case: network bytes of tenplex's plan, the network lower bound,
the bytes of the reference Tenplex's source choice (`CompileOptions(baseline="reference")`), and
the compile + verify time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache

import attrs

from demo.printer import Printer
from tenplex.compiler import CompileOptions, compile_plan, network_lower_bound
from tenplex.compiler.emit import human_bytes, plural
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC

PAPER_MODELS = ("gpt-1.3b", "gpt-2.7b", "gpt-6.7b")
PAPER_SRC = ((4, 2, 1), "2x4")
PAPER_DSTS = (((4, 2, 2), "4x4"), ((4, 4, 1), "4x4"), ((8, 2, 1), "4x4"))


def spec(model: str, tpd: tuple[int, int, int], cluster: str) -> str:
    """`gpt-1.3b:tp4,pp2,dp1@2x4`; model may carry its own options (`gpt-tiny:layers=8`)."""
    sep = "," if ":" in model else ":"
    return f"{model}{sep}tp{tpd[0]},pp{tpd[1]},dp{tpd[2]}@{cluster}"


def tpd_text(tpd: tuple[int, int, int]) -> str:
    return "(" + ",".join(map(str, tpd)) + ")"


@attrs.frozen
class Case:
    """One paper case's numbers (bytes are network bytes); `error` is set when it failed."""

    model: str
    dst: tuple[int, int, int]
    network: int = 0
    bound: int = 0
    bound_as_given: int = 0
    reference: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.network == self.bound


@lru_cache(maxsize=len(PAPER_MODELS))
def paper_src(model: str) -> PTC:
    """The paper's src PTC, built once per model and process."""
    return ptc_from_spec(spec(model, *PAPER_SRC))


def run_case(model: str, dst_tpd: tuple[int, int, int], dst_cluster: str) -> Case:
    """Compile (and so verify) tenplex's plan and the reference's for one case."""
    try:
        src, dst = paper_src(model), ptc_from_spec(spec(model, dst_tpd, dst_cluster))
        t0 = time.perf_counter()
        plan = compile_plan(src, dst)
        seconds = time.perf_counter() - t0
        reference = compile_plan(src, dst, CompileOptions(baseline="reference"))
    except TenplexError as e:
        return Case(model, dst_tpd, error=f"{type(e).__name__}: {e}")
    s = plan.stats
    return Case(model, dst_tpd, s.network_bytes, s.network_lower_bound_bytes, network_lower_bound(src, dst),
                reference.stats.network_bytes, seconds)  # fmt: skip


def run_cases(models: Sequence[str], dsts: Sequence, jobs: int) -> list[Case]:
    args = [(m, tpd, cluster) for m in models for tpd, cluster in dsts]
    if jobs <= 1:
        return [run_case(*a) for a in args]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_case, *zip(*args)))


def pct_saved(ours: int, theirs: int) -> str:
    return f"{100 * (theirs - ours) / theirs:.0f}%" if theirs else "-"


def cases_title(n: int) -> str:
    (tpd, cluster) = PAPER_SRC
    return (f"1. Scale-up, (T,P,D) = {tpd_text(tpd)} on {cluster.replace('x', ' hosts x ')} GPUs -> 4 hosts x 4 GPUs "
            f"(model + Adam state, {plural(n, 'case')})")  # fmt: skip


def show_cases(p: Printer, cases: list[Case]) -> None:
    """Part 1's table (its title, `cases_title`, comes before the cases run)."""
    rows = []
    for c in cases:
        if c.error:
            rows.append([c.model, f"-> {tpd_text(c.dst)}", "FAILED", "", "", "", "", c.error[:60]])
            continue
        rows.append([c.model, f"-> {tpd_text(c.dst)}", human_bytes(c.network), human_bytes(c.bound),
                     human_bytes(c.bound_as_given), human_bytes(c.reference), pct_saved(c.network, c.reference),
                     f"{c.seconds:.1f} s"])  # fmt: skip
    p.table(["model", "T,P,D", "tenplex", "lower bound", "bound, fixed ranks", "reference", "saved", "compile+verify"],
            rows, align="llrrrrrr")  # fmt: skip
    p.line("  lower bound: bytes each dst host needs that no src device on it holds, for the plan's rank placement;")
    p.line("  'fixed ranks': the same bound with every dst rank where the spec puts it (tenplex's place-ranks")
    p.line("  moves ranks to where their data already is; the reference cannot). compile_plan always verifies.")
