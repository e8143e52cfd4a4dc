"""`python -m bench --only cli`: how long `tenplex` commands take to start and finish.

Each command runs in a fresh process (`python -m tenplex.cli ...`, as the console script runs),
in alternating rounds with the anchor `python -c pass` (the interpreter alone) measured in the
same run: `tenplex --help`, `tenplex compile` of two small specs (`gpt-tiny:tp2@1x2` ->
`gpt-tiny:tp1,pp2@1x2`, the plan's summary on stdout), `tenplex inspect` of a small tenplex
checkpoint directory (gpt-tiny, tp2). Per command: wall seconds min/median/max, its ratio to
`python -c pass` of the same round min/median/max, the goal (issue 16: ≤ 1 s where torch is not
needed), and the heavy modules it imported (torch, ucxx, aiohttp, matplotlib, mfusepy, z3,
scipy: found with `python -X importtime`, in one more run). Results:
bench/results/cli.{md,json} (cli-quick.* with --quick).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import text_table, write_table
from bench.runner import ROOT

REPEATS, QUICK_REPEATS = 7, 3
GOAL_S = 1.0
HEAVY = ("torch", "ucxx", "aiohttp", "matplotlib", "mfusepy", "z3", "scipy")
HEADERS = ["command", "status", "wall s (min/med/max)", "÷ python -c pass (min/med/max)", "goal", "heavy imports"]


def commands(ckpt: Path) -> dict[str, list[str]]:
    tenplex = [sys.executable, "-m", "tenplex.cli"]
    return {"python -c pass": [sys.executable, "-c", "pass"], "tenplex --help": [*tenplex, "--help"],
            "tenplex compile": [*tenplex, "compile", "gpt-tiny:tp2@1x2", "gpt-tiny:tp1,pp2@1x2"],
            "tenplex inspect CKPT": [*tenplex, "inspect", str(ckpt)]}  # fmt: skip


def make_checkpoint(root: Path) -> Path:
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.arrays import arange_tensors, materialize
    from tenplex.runtime.checkpoint.directory import write_checkpoint

    ptc = ptc_from_spec("gpt-tiny:tp2@1x2")
    tensors = arange_tensors(ptc)
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}
    write_checkpoint(ptc, {st.id: materialize(ptc, tensors, st) for st in ptc.subtensors}, values, root / "ckpt")
    return root / "ckpt"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def wall(argv: list[str], timeout_s: float) -> float:
    """Seconds from start to exit. Raises RuntimeError naming the last error line."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=_env())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    return seconds


def heavy_imports(argv: list[str], timeout_s: float) -> list[str]:
    """The `HEAVY` top-level modules the command imports (`-X importtime` on stderr)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, timeout=timeout_s,
                          cwd=ROOT, env=_env())  # fmt: skip
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines() if line.startswith("import time:")}
    return sorted(names & set(HEAVY))


def measure(quick: bool, timeout_s: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as d:
        sides = commands(make_checkpoint(Path(d)))
        rows = {name: {"name": name, "status": "ok", "wall_s": [], "ratio": []} for name in sides}
        for _ in range(QUICK_REPEATS if quick else REPEATS):
            anchor = None
            for name, argv in sides.items():
                row = rows[name]
                if row["status"] != "ok":
                    continue
                try:
                    seconds = wall(argv, timeout_s)
                except subprocess.TimeoutExpired:
                    row.update(status="timeout", timeout_s=timeout_s)
                    continue
                except RuntimeError as e:
                    row.update(status="error", error=str(e))
                    continue
                anchor = seconds if name == "python -c pass" else anchor
                row["wall_s"].append(seconds)
                row["ratio"].append(seconds / anchor)
        for name, argv in sides.items():
            rows[name]["heavy"] = heavy_imports(argv, timeout_s)
    return list(rows.values())


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return "/".join(f"{x:.2f}" for x in (xs[0], xs[len(xs) // 2], xs[-1])) if xs else ""


def row_cells(r: dict[str, Any]) -> list[str]:
    if r["status"] != "ok":
        return [r["name"], r["status"].upper(), "", "", "", r.get("error", "")[:60]]
    med = sorted(r["wall_s"])[len(r["wall_s"]) // 2]
    goal = "" if r["name"] == "python -c pass" else f"≤ {GOAL_S:.0f} s: {'met' if med <= GOAL_S and not r['heavy'] else 'MISSED'}"
    return [r["name"], "ok", _spread(r["wall_s"]), _spread(r["ratio"]), goal, ", ".join(r["heavy"]) or "none"]


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    load = [os.getloadavg()[0]]
    rows = measure(quick, timeout_s)
    load.append(os.getloadavg()[0])
    cells = [row_cells(r) for r in rows]
    print(text_table(HEADERS, cells), flush=True)
    title = f"Command start-up (`python -m bench --only cli{' --quick' if quick else ''}`)"
    about = __doc__.split("\n\n", 1)[1].strip()
    stem = "cli-quick" if quick else "cli"
    return rows, write_table(out_dir, stem, title, info, load, about, HEADERS, cells, {"rows": rows})
