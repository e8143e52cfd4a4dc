"""`python -m bench --only deepspeed`: tenplex's DeepSpeed reshard vs DeepSpeed's own path to a
new DP world size (`ds_to_universal`, then a universal load).

Source: a ZeRO-2 checkpoint DeepSpeed itself saves (`fixtures.deepspeed.engine`: 2 gloo CPU
ranks, AdamW, one step) of 16 Linear layers of width 1024 (16.8 M parameters, 268 MB of weights,
fp32 masters and both moments; --quick: 2 layers of width 256). Target: DP 3. Sides, alternated,
each repeated (3 times; the order flips every repeat), in this process, page cache warm:

- tenplex: `reshard_deepspeed(src, "dp=3", out)` (read, compile + verify, execute, write a ZeRO
  checkpoint for DP 3);
- DeepSpeed: `ds_to_universal` (1 extract and 1 merge worker, in-process, as tenplex's one
  worker), which writes the universal checkpoint (and a temporary copy of every fragment).

Figures: CPU seconds (`time.process_time`), wall seconds, and bytes written (`wchar` of
/proc/self/io: every byte handed to write(), temporaries included), min/median/max; the ratio is
DeepSpeed / tenplex. Then, once per side, 3 gloo ranks load the result with
`engine.load_checkpoint` (DeepSpeed's plain load of tenplex's output; DeepSpeed's universal load
of its own, which reshards at load time): rank CPU seconds summed, from before the call to its
return. Checked: the two loads leave every rank with the same fp32 masters and moments, bit for
bit. Results: bench/results/deepspeed.{md,json} (deepspeed-quick.* with --quick).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import fmt_bytes, md_table, text_table, write_results

FULL, QUICK = (1024, 16), (256, 2)
SRC_DP, DST_DP, REPEATS = 2, 3, 3
HEADERS = ["case", "state", "side", "CPU s (min/med/max)", "wall s (med)", "bytes written", "load CPU s",
           "DeepSpeed / tenplex CPU (min/med/max)", "bytes ratio", "checked"]  # fmt: skip


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _measure(fn) -> dict[str, float]:
    w, c, t = _wchar(), time.process_time(), time.perf_counter()
    fn()
    return {"cpu": time.process_time() - c, "wall": time.perf_counter() - t, "bytes": _wchar() - w}


def _loads(tmp: Path, plain: Path, universal: Path, size: tuple[int, int]) -> dict[str, Any]:
    """DP_DST ranks: load tenplex's output, then DeepSpeed's universal one, in one engine each rank;
    returns the summed rank CPU seconds per side and whether the loaded states agree."""
    import torch

    from fixtures.deepspeed.engine import _env, make_engine
    from fixtures.gloo import run_ranks

    def rank(r: int, w: int, _: Path) -> None:
        _env(r, w)
        engine = make_engine(2, size=size)
        out = {}
        for side, path in (("tenplex", plain), ("deepspeed", universal)):
            engine._config.load_universal_checkpoint = side == "deepspeed"
            start = time.process_time()
            engine.load_checkpoint(str(path))
            cpu = time.process_time() - start
            zero = engine.optimizer
            groups = [(g.clone(), *(zero.optimizer.state[pg["params"][0]][k].clone() for k in ("exp_avg", "exp_avg_sq")))
                      for g, pg in zip(zero.single_partition_of_fp32_groups, zero.optimizer.param_groups)]  # fmt: skip
            out[side] = (cpu, groups)
        same = all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(out["tenplex"][1], out["deepspeed"][1]))
        torch.save({"cpu": {k: v[0] for k, v in out.items()}, "same": same}, tmp / f"load{r}.pt")

    run_ranks(rank, DST_DP, tmp, "bench-load", timeout=600)
    docs = [torch.load(tmp / f"load{r}.pt") for r in range(DST_DP)]
    return {"cpu": {s: sum(d["cpu"][s] for d in docs) for s in ("tenplex", "deepspeed")}, "same": all(d["same"] for d in docs)}


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return min(xs), statistics.median(xs), max(xs)


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from fixtures.deepspeed.engine import to_universal, train_and_save
    from tenplex.frameworks.deepspeed import reshard_deepspeed

    size = QUICK if quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="bench-deepspeed-"))
    try:
        train_and_save(tmp / "src", SRC_DP, 2, tmp, steps=1, size=size, dump=False)
        state = sum(f.stat().st_size for f in (tmp / "src").rglob("*.pt"))
        runs: dict[str, list[dict[str, float]]] = {"tenplex": [], "deepspeed": []}
        for i in range(REPEATS):
            sides = [("tenplex", lambda i=i: reshard_deepspeed(tmp / "src", f"dp={DST_DP}", tmp / f"t{i}")),
                     ("deepspeed", lambda i=i: to_universal(tmp / "src" / "global_step1", tmp / f"u{i}"))]  # fmt: skip
            for side, fn in sides if i % 2 == 0 else sides[::-1]:
                runs[side].append(_measure(fn))
        loads = _loads(tmp, tmp / "t0", tmp / "u0", size)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = [d["cpu"] / t["cpu"] for t, d in zip(runs["tenplex"], runs["deepspeed"])]
    row = {"name": f"ZeRO-2 {size[1]}x Linear({size[0]}) DP {SRC_DP} -> {DST_DP}", "state_bytes": state, "runs": runs,
           "loads_cpu_s": loads["cpu"], "checked": loads["same"], "ratio_cpu": _stats(ratios),
           "bytes_ratio": statistics.median(d["bytes"] for d in runs["deepspeed"]) / statistics.median(t["bytes"] for t in runs["tenplex"]),
           "status": "ok" if loads["same"] else "error", "error": None if loads["same"] else "the loads differ"}  # fmt: skip
    cells = _cells(row)
    print(text_table(HEADERS, cells) + "\n", flush=True)
    md = "\n".join([
        "# DeepSpeed: tenplex reshard vs ds_to_universal + universal load (`python -m bench --only deepspeed`)", "",
        f"{info['date']}, git {info.get('git_rev') or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        __doc__.split("\n\n", 1)[1].strip(), "", md_table(HEADERS, cells), ""])  # fmt: skip
    stem = "deepspeed-quick" if quick else "deepspeed"
    return [row], write_results(out_dir, stem, {"machine": info, "rows": [row]}, md)


def _cells(r: dict[str, Any]) -> list[list[str]]:
    out = []
    for side in ("tenplex", "deepspeed"):
        runs = r["runs"][side]
        cpu = _stats([x["cpu"] for x in runs])
        ratio = "/".join(f"{x:.2f}" for x in r["ratio_cpu"]) if side == "deepspeed" else "1 (anchor)"
        brat = f"{r['bytes_ratio']:.2f}" if side == "deepspeed" else "1"
        out.append([r["name"] if side == "tenplex" else "", fmt_bytes(r["state_bytes"]) if side == "tenplex" else "",
                    side if side == "tenplex" else "ds_to_universal", "/".join(f"{x:.2f}" for x in cpu),
                    f"{statistics.median(x['wall'] for x in runs):.2f}", fmt_bytes(int(statistics.median(x["bytes"] for x in runs))),
                    f"{r['loads_cpu_s'][side]:.2f}", ratio, brat, "same" if r["checked"] else "DIFFER"])  # fmt: skip
    return out


if __name__ == "__main__":
    from bench.report import machine_info

    run("--quick" in sys.argv, 600.0, Path(__file__).parent / "results", machine_info())
