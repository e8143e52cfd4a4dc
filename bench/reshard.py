"""`python -m bench --only reshard`: `tenplex reshard` of a checkpoint directory vs `cp -r` of it.

Source: a tenplex checkpoint directory made from a spec (GPT-like, bf16 weights + fp32 Adam
state, 1.07 GiB; --quick: 50 MiB) in layout tp2,pp2, in /dev/shm (tmpfs: no disk in the way, so
the figure is the cost of copying bytes). Sides, each run as a command in a fresh process, in
alternating rounds (cp, workers 1, workers 2, cp, ...):

- `cp -r SRC OUT`: the anchor, the same bytes copied file by file (`copy_file_range`);
- `tenplex reshard SRC --to tp4,pp1 --out OUT --workers 1`: read, compile, write the new layout
  (in-process plan, each dst file written once from the mapped src, by the kernel's copies; the
  dst files allocated by a helper process while the plan compiles);
- the same with `--workers 2`: the dst files shared out by bytes between two worker processes
  forked once the plan is compiled, each writing its share the same way (nothing moves between
  them: each reads the src files it needs).

- `start only`: a Python process that imports what `--workers 1` imports and does nothing else:
  the part of each tenplex side that is interpreter start and imports (not a goal; it shows
  what is left for the work).

tenplex's bytecode is compiled once before the rounds (`compileall` into `__pycache__`), as an
installed package has it: where PYTHONDONTWRITEBYTECODE is set and nothing wrote it, every
tenplex process would otherwise compile its modules from source.

Per side: wall seconds (process start to exit: what a user waits for) min/median/max, the ratio
to the `cp -r` of the same round min/median/max, and the seconds tenplex reports itself
(`--json`, the rest is interpreter start and imports). Every output is checked after its run:
each dst file's array equals the arange oracle (digests), each file `cp` copied equals its src
file. Results: bench/results/reshard.{md,json} (reshard-quick.* with --quick).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import fmt_bytes, text_table, write_table
from bench.runner import ROOT

MODEL = "gpt-tiny:layers=6,hidden=960,heads=16,ffn=3840,vocab=8192"  # 1.07 GiB in tp2,pp2
QUICK_MODEL = "gpt-tiny:layers=2,hidden=256,heads=8,ffn=1024,vocab=4096"
SRC_LAYOUT, DST_LAYOUT = "tp2,pp2@1x4", "tp4,pp1@1x4"
REPEATS, QUICK_REPEATS = 5, 3
GOALS = {"workers 1": 1.5, "workers 2": 2.5}  # issue 16: wall / cp -r
HEADERS = ["side", "status", "wall s (min/med/max)", "÷ cp -r (min/med/max)", "goal", "reported s (median)", "checked"]


def make_source(root: Path, quick: bool) -> tuple[Path, Path, dict[str, str]]:
    """(src dir, dst PTC file, dst sub-tensor id -> oracle digest)."""
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.ir.serialize import dumps
    from tenplex.runtime.arrays import arange_tensors, materialize
    from tenplex.runtime.checkpoint.directory import write_checkpoint

    model = QUICK_MODEL if quick else MODEL
    src, dst = ptc_from_spec(f"{model},{SRC_LAYOUT}"), ptc_from_spec(f"{model},{DST_LAYOUT}")
    tensors = arange_tensors(src)
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in src.partitions}
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, values, root / "src")
    (root / "dst.json").write_text(dumps(dst))
    oracle = {st.id: _digest(materialize(dst, tensors, st)) for st in dst.subtensors}
    return root / "src", root / "dst.json", oracle


def _digest(array: Any) -> str:
    return hashlib.blake2b(memoryview(array.reshape(-1).view("u1")), digest_size=16).hexdigest()


def check_reshard(out: Path, oracle: dict[str, str]) -> int:
    """Bytes compared: every dst array of `out` against the oracle. Raises AssertionError."""
    from tenplex.runtime.checkpoint.directory import read_checkpoint

    _, arrays, _ = read_checkpoint(out, mapped=True)
    wrong = [sid for sid, want in oracle.items() if _digest(arrays[sid]) != want]
    if wrong or arrays.keys() != oracle.keys():
        raise AssertionError(f"{out}: {len(wrong)} dst array(s) differ from the oracle, e.g. {wrong[:2]}")
    return sum(a.nbytes for a in arrays.values())


def check_copy(src: Path, out: Path) -> int:
    """Bytes compared: every file of `src` against its copy in `out`. Raises AssertionError."""
    n = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if (out / path.relative_to(src)).read_bytes() != data:
            raise AssertionError(f"{out}: the copy of {path.relative_to(src)} differs")
        n += len(data)
    return n


START = "import tenplex.cli.app, tenplex.cli.reshard, tenplex.runtime.reshard, tenplex.runtime.checkpoint.planned"


def compile_bytecode() -> None:
    """tenplex's modules compiled to bytecode (`__pycache__`, ignored by git), as an installed
    package has them: with PYTHONDONTWRITEBYTECODE set and none written, every tenplex process
    would compile its ~100 modules from source at start (0.15-0.25 CPU s here)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "tenplex")], check=True, stdout=subprocess.DEVNULL)


def commands(src: Path, dst: Path, out: Path) -> dict[str, list[str]]:
    tenplex = [sys.executable, "-m", "tenplex.cli", "reshard", str(src), "--to", str(dst), "--out", str(out), "--json"]
    return {"cp -r": ["cp", "-r", str(src), str(out)], "workers 1": [*tenplex, "--workers", "1"],
            "workers 2": [*tenplex, "--workers", "2"], "start only": [sys.executable, "-c", START]}  # fmt: skip


def run_side(argv: list[str], timeout_s: float) -> tuple[float, float | None]:
    """(wall seconds, seconds tenplex reports or None). Raises RuntimeError with the last error line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    reported = json.loads(done.stdout)["seconds"]["total"] if done.stdout.strip() else None
    return wall, reported


def measure(quick: bool, timeout_s: float) -> tuple[list[dict[str, Any]], int]:
    """Rows (one per side) and the source's bytes."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="bench-reshard-", dir=base) as d:
        root = Path(d)
        src, dst, oracle = make_source(root, quick)
        nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        sides = commands(src, dst, root / "out")
        rows = {name: {"name": name, "status": "ok", "wall_s": [], "reported_s": [], "ratio": [], "checked_bytes": 0}
                for name in sides}  # fmt: skip
        for _ in range(QUICK_REPEATS if quick else REPEATS):
            cp_s = None
            for name, argv in sides.items():
                row = rows[name]
                if row["status"] != "ok":
                    continue
                try:
                    wall, reported = run_side(argv, timeout_s)
                    if name != "start only":
                        row["checked_bytes"] += check_copy(src, root / "out") if name == "cp -r" else check_reshard(root / "out", oracle)
                except subprocess.TimeoutExpired:
                    row.update(status="timeout", timeout_s=timeout_s)
                except (RuntimeError, AssertionError) as e:
                    row.update(status="error", error=str(e))
                else:
                    cp_s = wall if name == "cp -r" else cp_s
                    row["wall_s"].append(wall)
                    row["reported_s"].append(reported)
                    row["ratio"].append(wall / cp_s if cp_s else None)
                finally:
                    shutil.rmtree(root / "out", ignore_errors=True)
            done = [f"{name} {row['wall_s'][-1]:.2f}s" for name, row in rows.items() if row["wall_s"]]
            print(f"  round: {', '.join(done)}", file=sys.stderr, flush=True)
    return list(rows.values()), nbytes


def _spread(xs: list[float], fmt: str) -> str:
    xs = sorted(x for x in xs if x is not None)
    return "/".join(format(x, fmt) for x in (xs[0], xs[len(xs) // 2], xs[-1])) if xs else ""


def row_cells(r: dict[str, Any]) -> list[str]:
    goal = GOALS.get(r["name"])
    if r["status"] != "ok":
        return [r["name"], r["status"].upper(), "", "", "", "", r.get("error", "")[:60]]
    med = sorted(r["ratio"])[len(r["ratio"]) // 2] if r["ratio"] else None
    verdict = "" if goal is None or med is None else f"≤ {goal}x: {'met' if med <= goal else 'MISSED'}"
    reported = [x for x in r["reported_s"] if x is not None]
    return [r["name"], "ok", _spread(r["wall_s"], ".2f"), _spread(r["ratio"], ".2f") if r["name"] != "cp -r" else "1",
            verdict, f"{sorted(reported)[len(reported) // 2]:.2f}" if reported else "", fmt_bytes(r["checked_bytes"])]  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    load = [os.getloadavg()[0]]
    rows, nbytes = measure(quick, timeout_s)
    load.append(os.getloadavg()[0])
    cells = [row_cells(r) for r in rows]
    print(text_table(HEADERS, cells), flush=True)
    title = f"Offline resharding vs `cp -r` (`python -m bench --only reshard{' --quick' if quick else ''}`)"
    about = __doc__.split("\n\n", 1)[1].strip()
    stem = "reshard-quick" if quick else "reshard"
    doc = {"source_bytes": nbytes, "rows": rows}
    return rows, write_table(out_dir, stem, title, info, load, about, HEADERS, cells, doc, f"; source {fmt_bytes(nbytes)}")
