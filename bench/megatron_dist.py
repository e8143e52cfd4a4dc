"""Table `megatron`: a Megatron `torch_dist` checkpoint into another layout, tenplex's reshard plus
Megatron's load of its output vs Megatron's own load-time reshard of the original.

Source: megatron-core saves a GPT model (SwiGLU, GQA, untied output layer) with Adam state under
tp=2,pp=1 in gloo CPU ranks (`fixtures.megatron_dist`): 8 layers, hidden 512, 8 heads, 4 query
groups, ffn 2048, vocab 8192 (--quick: 2 layers, hidden 64). Target: tp=1,pp=2 (two ranks).

- anchor: `dist_checkpointing.load` of the original under the target (Megatron reshards at load);
- native: `dist_checkpointing.load` of a checkpoint megatron-core saved under the target itself
  (same model and sizes, other random values): the load time the goal compares with;
- tenplex: `reshard_megatron_dist(src, "tp=1,pp=2", out)` in this process (read, compile and
  verify the plan, execute, write; wall and CPU seconds), then `dist_checkpointing.load` of OUT
  under the target.

A load is the slowest rank's wall time from its `load` call to its return (the model is built
before the clock starts). One unmeasured load of each source first; then repeats alternate the sides (anchor, native, tenplex); the page cache is warm
(the sources were just written) and tenplex's writes are fsynced (`write_dcp`'s default). Ratios
are per repeat, as min/median/max: `load / native` (the goal: <= 1, tenplex's output loads no
slower than a checkpoint Megatron wrote itself), `load / anchor`, and `reshard+load / anchor`
(tenplex's whole path against Megatron's load-time reshard). Checked once: the tenplex and anchor
loads return the same bytes on every rank.
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import fmt_bytes, md_table, text_table, write_results

FULL = {"layers": 8, "hidden": 512, "heads": 8, "groups": 4, "ffn": 2048, "vocab": 8192}
QUICK = {"layers": 2, "hidden": 64, "heads": 4, "groups": 2, "ffn": 128, "vocab": 256}
HEADERS = ["case", "state", "anchor load s", "native load s", "tenplex reshard s (CPU s)", "tenplex load s",
           "load / native", "load / anchor", "reshard+load / anchor", "checked", "goal load/native <= 1"]  # fmt: skip


def _ratios(xs: list[float]) -> str:
    """min/median/max."""
    return f"{min(xs):.2f}/{statistics.median(xs):.2f}/{max(xs):.2f}"


def _bytes(t: Any) -> bytes:
    return t.contiguous().numpy().tobytes()


def measure(quick: bool, repeats: int) -> dict[str, Any]:
    from fixtures.megatron_dist.gpt import ITERATION, Job, load, load_seconds, save
    from tenplex.frameworks.megatron_dist.reshard import reshard_megatron_dist

    sizes = QUICK if quick else FULL
    src_job, dst_job = Job(tp=2, pp=1, **sizes), Job(tp=1, pp=2, **sizes)
    step = f"iter_{ITERATION:07d}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-megatron-dist-"))
    try:
        save(tmp / "src", src_job)
        save(tmp / "native", dst_job)
        state = sum(f.stat().st_size for f in (tmp / "src" / step).iterdir())
        for warm in ("src", "native"):  # unmeasured: the first load of a run pays a start-up the others do not
            load_seconds(tmp / warm / step, dst_job)
        anchor, native, reshard, cpu, ours = [], [], [], [], []
        for i in range(repeats):
            anchor.append(load_seconds(tmp / "src" / step, dst_job))
            native.append(load_seconds(tmp / "native" / step, dst_job))
            start, start_cpu = time.perf_counter(), time.process_time()
            reshard_megatron_dist(tmp / "src", "tp=1,pp=2", tmp / f"out{i}")
            reshard.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            ours.append(load_seconds(tmp / f"out{i}" / step, dst_job))
        a, b = load(tmp / "src" / step, dst_job), load(tmp / "out0" / step, dst_job)
        equal = all((ka, oa, x.dtype, x.shape) == (kb, ob, y.dtype, y.shape) and _bytes(x) == _bytes(y)
                    for da, db in zip(a, b, strict=True) for (ka, oa, x), (kb, ob, y) in zip(da, db, strict=True))  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    name = f"gpt {','.join(f'{k}={v}' for k, v in sizes.items())} tp=2,pp=1 -> tp=1,pp=2"
    return {"name": name, "status": "ok", "state_bytes": state, "anchor_load_s": anchor, "native_load_s": native,
            "tenplex_reshard_s": reshard, "tenplex_reshard_cpu_s": cpu, "tenplex_load_s": ours,
            "load_native_ratio": [o / n for o, n in zip(ours, native)], "load_ratio": [o / x for o, x in zip(ours, anchor)],
            "reshard_load_ratio": [(r + o) / x for r, o, x in zip(reshard, ours, anchor)], "checked": equal}  # fmt: skip


def cells(r: dict[str, Any]) -> list[str]:
    med = statistics.median
    return [r["name"], fmt_bytes(r["state_bytes"]), f"{med(r['anchor_load_s']):.3f}", f"{med(r['native_load_s']):.3f}",
            f"{med(r['tenplex_reshard_s']):.3f} ({med(r['tenplex_reshard_cpu_s']):.3f})", f"{med(r['tenplex_load_s']):.3f}",
            _ratios(r["load_native_ratio"]), _ratios(r["load_ratio"]), _ratios(r["reshard_load_ratio"]),
            "same bytes" if r["checked"] else "**DIFFER**", "met" if med(r["load_native_ratio"]) <= 1.0 else "MISSED"]  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    if importlib.util.find_spec("megatron.core") is None:
        return [{"name": "megatron torch_dist", "status": "skipped", "error": "megatron-core is not installed"}], []
    row = measure(quick, 3 if quick else 5)
    if not row["checked"]:
        row.update(status="error", error="the two loads returned different bytes")
    rows = [cells(row)]
    print(text_table(HEADERS, rows), file=sys.stderr)
    stem = "megatron-quick" if quick else "megatron"
    head = __doc__.split("\n\n", 1)[1].strip()
    md = "\n".join([
        "# Megatron torch_dist resharding (`python -m bench --only megatron`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        head, "", md_table(HEADERS, rows), ""])  # fmt: skip
    return [row], write_results(out_dir, stem, {"machine": info, "rows": [row]}, md)
