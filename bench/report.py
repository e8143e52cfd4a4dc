"""Tables (plain text and markdown), machine info, the JSON file and an optional plot."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.runner import ROOT

GOAL_RSS_BYTES = 4 << 30

COMPILE_HEADERS = [
    "case",
    "status",
    "build s",
    "compile CPU s min/med/max",
    "compile/goal",
    "check CPU s min/med/max",
    "check/goal",
    "peak RSS",
    "ops (copy/fill/value)",
    "messages",
    "rounds",
    "goal",
]
SCALING_HEADERS = ["GPUs", "ops", "compile CPU s", "µs/op", "growth", "check CPU s", "µs/op", "growth"]
BYTES_HEADERS = [
    "model",
    "src→dst",
    "dst state",
    "plan network",
    "lower bound",
    "equal?",
    "reference network",
    "ref/tenplex",
    "predicted s",
    "lower-bound s",
]


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _failed(r: dict[str, Any], cells: int) -> list[str]:
    """`cells` cells: the status (upper-case, to stand out), blanks, and why."""
    return [r["status"].upper()] + [""] * (cells - 2) + [r.get("error", f"after {r.get('timeout_s', 0):.0f} s")[:60]]


def _runs(r: dict[str, Any], key: str) -> list[float]:
    """A phase's CPU seconds over the runs (a single run's row holds a number)."""
    v = r[key]
    return sorted(v) if isinstance(v, list) else [v]


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _spread(xs: list[float]) -> str:
    return f"{xs[0]:.2f}" if len(xs) == 1 else f"{xs[0]:.2f}/{median(xs):.2f}/{xs[-1]:.2f}"


def _ratio(xs: list[float], goal: float | None) -> str:
    """Each of min/median/max against the goal (≤ 1.00 meets it)."""
    if goal is None:
        return "-"
    return "/".join(f"{x / goal:.2f}x" for x in ([xs[0], median(xs), xs[-1]] if len(xs) > 1 else xs))


def compile_row(r: dict[str, Any]) -> list[str]:
    if r["status"] != "ok":
        return [r["name"]] + _failed(r, len(COMPILE_HEADERS) - 1)
    p = r["plan"]
    build, comp, check = _runs(r, "build_s"), _runs(r, "compile_s"), _runs(r, "check_s")
    goal = r.get("goal_s") or (None, None)
    met = [median(xs) <= g for xs, g in zip((comp, check), goal) if g is not None]
    verdict = "-" if not met else "met" if all(met) and r["peak_rss_bytes"] <= GOAL_RSS_BYTES else "MISSED"
    return [r["name"], "ok", f"{median(build):.2f}", _spread(comp), _ratio(comp, goal[0]), _spread(check), _ratio(check, goal[1]),
            fmt_bytes(r["peak_rss_bytes"]), f"{p['ops']} ({p.get('CopyOp', 0)}/{p.get('FillOp', 0)}/{p.get('ValueOp', 0)})",
            str(p["messages"]), str(p["rounds"]), verdict]  # fmt: skip


def scaling_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The scaling series (rows with `gpus`), by size: median CPU seconds, per op, and the
    growth exponent against the previous size (log t ratio / log size ratio; 1.00 is linear)."""
    series = sorted((r for r in rows if r["status"] == "ok" and r.get("gpus")), key=lambda r: r["gpus"])
    out, prev = [], None
    for r in series:
        ops = r["plan"]["ops"]
        t = (median(_runs(r, "compile_s")), median(_runs(r, "check_s")))
        grow = ["-", "-"] if prev is None else [f"n^{math.log(a / b) / math.log(r['gpus'] / prev[0]):.2f}" if a > 0 and b > 0 else "-"
                                                 for a, b in zip(t, prev[1])]  # fmt: skip
        out.append([str(r["gpus"]), str(ops), f"{t[0]:.2f}", f"{t[0] / ops * 1e6:.1f}", grow[0], f"{t[1]:.2f}", f"{t[1] / ops * 1e6:.1f}", grow[1]])
        prev = (r["gpus"], t)
    return out


def bytes_row(r: dict[str, Any]) -> list[str]:
    model, _, change = r["name"].partition(" ")
    if r["status"] != "ok":
        return [model, change] + _failed(r, len(BYTES_HEADERS) - 2)
    net, ref = r["network_bytes"], r["reference_network_bytes"]
    ratio = f"{ref / net:.2f}x" if net else ("1.00x" if ref == 0 else "inf")
    return [model, change, fmt_bytes(r["dst_state_bytes"]), fmt_bytes(net), fmt_bytes(r["lower_bound_bytes"]),
            "yes" if r["equal"] else "**NO**", fmt_bytes(ref), ratio, f"{r['predicted_s']:.3f}", f"{r['lower_bound_s']:.3f}"]  # fmt: skip


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def git_rev(root: Path = ROOT) -> str | None:
    """HEAD's commit, read from .git without running git; None when there is no repository."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        common = git / "commondir"
        bases = [git] + ([(git / common.read_text().strip()).resolve()] if common.is_file() else [])
        for base in bases:
            if (base / ref).is_file():
                return (base / ref).read_text().strip()
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except OSError:
        return None
    return None


def machine_info() -> dict[str, Any]:
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in _lines("/proc/cpuinfo") if ln.startswith("model name")),
        platform.processor(),
    )
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu, "python": sys.version.split()[0], "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_rev": git_rev(),
    }  # fmt: skip


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def markdown(info: dict[str, Any], compile_rows: list[dict], bytes_rows: list[dict]) -> str:
    parts = ["# Compiler benchmark (`python -m bench`)", "",
             f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", ""]  # fmt: skip
    if compile_rows:
        parts += ["## Compile + verify, one core, fresh process per run", "",
                  "CPU seconds (`time.process_time`), min/median/max over the runs; `x/goal` is each against the case's goal "
                  f"(≤ 1.00x meets it); peak RSS goal ≤ {fmt_bytes(GOAL_RSS_BYTES)}.", "",
                  md_table(COMPILE_HEADERS, [compile_row(r) for r in compile_rows]), "",
                  "Scaling (medians; growth n^k against the previous size, k = 1.00 is linear):", "",
                  md_table(SCALING_HEADERS, scaling_rows(compile_rows)), "",
                  "\n".join(f"- {r['name']}: `{r['src']}` → `{r['dst']}`" for r in compile_rows), ""]  # fmt: skip
    if bytes_rows:
        parts += ["## Network bytes: plan vs lower bound vs reference baseline", "",
                  md_table(BYTES_HEADERS, [bytes_row(r) for r in bytes_rows]), ""]  # fmt: skip
    return "\n".join(parts)


def write_results(out_dir: Path, stem: str, doc: dict[str, Any], md: str) -> list[Path]:
    """`<stem>.json` (`doc`, sorted keys) and `<stem>.md` (`md`) in `out_dir`; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(md)
    return paths


def write_table(out_dir: Path, stem: str, title: str, info: dict[str, Any], load: list[float], about: str,
                headers: list[str], cells: list[list[str]], doc: dict[str, Any], facts: str = "") -> list[Path]:
    """bench/results/<stem>.{md,json} of one table: a title, the machine and the load average
    before and after the run (plus `facts`), `about` (the module doc's body), the table."""
    md = "\n".join([f"# {title}", "",
                    f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs "
                    f"({info['cpu']}); load average {load[0]:.1f} before, {load[1]:.1f} after{facts}", "",
                    about, "", md_table(headers, cells), ""])  # fmt: skip
    return write_results(out_dir, stem, {"machine": info, "load_average": load, **doc}, md)


def write(
    out_dir: Path, stem: str, info: dict[str, Any], compile_rows: list[dict], bytes_rows: list[dict]
) -> list[Path]:
    doc = {"machine": info, "compile": compile_rows, "bytes": bytes_rows}
    paths = write_results(out_dir, stem, doc, markdown(info, compile_rows, bytes_rows))
    png = plot(out_dir / f"{stem}.png", bytes_rows)
    return paths + ([png] if png else [])


def plot(path: Path, bytes_rows: list[dict]) -> Path | None:
    """A bar chart of network GiB per case (lower bound, Tenplex, reference); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in bytes_rows if r["status"] == "ok"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, len(rows)), 4))
    xs = range(len(rows))
    for i, (key, label) in enumerate(
        [("lower_bound_bytes", "lower bound"), ("network_bytes", "tenplex"), ("reference_network_bytes", "reference")]
    ):
        ax.bar([x + (i - 1) * 0.27 for x in xs], [r[key] / (1 << 30) for r in rows], 0.27, label=label)
    ax.set_xticks(list(xs), [r["name"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("network GiB")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
