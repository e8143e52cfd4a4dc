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

TP row: the Megatron-like model of `fixtures.deepspeed.tp` (a vocab-parallel embedding of
16000 rows padded to 16384 and hidden 512, a column- and a row-parallel linear of ffn 2048:
10.5 M parameters; --quick: hidden 64, ffn 256, vocab 1000 padded to 1024) trained by ZeRO-2 at
TP 2 x DP 2 (4 gloo ranks, an `mpu`), resharded to TP 1 x DP 1 by tenplex
(`reshard_deepspeed(src, "dp=1,tp=1", out)`) and by `ds_to_universal` (which learns the split
from the same `universal_checkpoint_info`), same measures and repeats; then one rank loads each
(plain load; universal load). Checked: the same fp32 masters, moments and weights, but for the
padded vocabulary rows, which `ds_to_universal` drops and the universal load zeroes (tenplex
keeps them).
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
TP_FULL, TP_QUICK = (512, 2048, 16000, 16384), (64, 256, 1000, 1024)
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
        runs = _sides(tmp, "src", f"dp={DST_DP}", "global_step1", reshard_deepspeed, to_universal)
        loads = _loads(tmp, tmp / "src-t0", tmp / "src-u0", size)
        rows = [_row(f"ZeRO-2 {size[1]}x Linear({size[0]}) DP {SRC_DP} -> {DST_DP}", state, runs, loads)]
        rows.append(_tp_row(tmp, TP_QUICK if quick else TP_FULL, reshard_deepspeed, to_universal))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cells = [c for row in rows for c in _cells(row)]
    print(text_table(HEADERS, cells) + "\n", flush=True)
    md = "\n".join([
        "# DeepSpeed: tenplex reshard vs ds_to_universal + universal load (`python -m bench --only deepspeed`)", "",
        f"{info['date']}, git {info.get('git_rev') or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        __doc__.split("\n\n", 1)[1].strip(), "", md_table(HEADERS, cells), ""])  # fmt: skip
    stem = "deepspeed-quick" if quick else "deepspeed"
    return rows, write_results(out_dir, stem, {"machine": info, "rows": rows}, md)


def _sides(tmp: Path, src: str, to: str, tag: str, reshard, to_universal) -> dict[str, list[dict[str, float]]]:
    """REPEATS alternating runs of tenplex's reshard of tmp/src to `to` (into tmp/{src}-t{i}) and
    ds_to_universal (into tmp/{src}-u{i})."""
    runs: dict[str, list[dict[str, float]]] = {"tenplex": [], "deepspeed": []}
    for i in range(REPEATS):
        sides = [("tenplex", lambda i=i: reshard(tmp / src, to, tmp / f"{src}-t{i}")),
                 ("deepspeed", lambda i=i: to_universal(tmp / src / tag, tmp / f"{src}-u{i}"))]  # fmt: skip
        for side, fn in sides if i % 2 == 0 else sides[::-1]:
            runs[side].append(_measure(fn))
    return runs


def _row(name: str, state: int, runs: dict, loads: dict) -> dict[str, Any]:
    ratios = [d["cpu"] / t["cpu"] for t, d in zip(runs["tenplex"], runs["deepspeed"])]
    return {"name": name, "state_bytes": state, "runs": runs, "loads_cpu_s": loads["cpu"], "checked": loads["same"],
            "ratio_cpu": _stats(ratios),
            "bytes_ratio": statistics.median(d["bytes"] for d in runs["deepspeed"]) / statistics.median(t["bytes"] for t in runs["tenplex"]),
            "status": "ok" if loads["same"] else "error", "error": None if loads["same"] else "the loads differ"}  # fmt: skip


def _tp_row(tmp: Path, dims: tuple[int, int, int, int], reshard, to_universal) -> dict[str, Any]:
    """The TP row: TP 2 x DP 2 -> TP 1 x DP 1 (see the module docstring)."""
    import torch

    from fixtures.deepspeed.tp import load_tp, train_and_save_tp

    train_and_save_tp(tmp / "tp", 2, 2, 2, tmp, steps=1, dims=dims, dump=False)
    state = sum(f.stat().st_size for f in (tmp / "tp").rglob("*.pt"))
    runs = _sides(tmp, "tp", "dp=1,tp=1", "global_step1", reshard, to_universal)
    (plain,), (uni,) = load_tp(tmp / "tp-t0", 1, 1, 2, tmp, dims=dims), load_tp(tmp / "tp-u0", 1, 1, 2, tmp, universal=True, dims=dims)
    v = dims[2]
    same = all(torch.equal(plain[n][k][:v] if n == "embed.weight" else plain[n][k], uni[n][k][:v] if n == "embed.weight" else uni[n][k])
               for n in plain if isinstance(plain[n], dict) for k in plain[n])  # fmt: skip
    loads = {"cpu": {"tenplex": plain["load_cpu_s"], "deepspeed": uni["load_cpu_s"]}, "same": same and not uni["embed.weight"]["fp32"][v:].any()}
    return _row(f"TP: embedding {dims[3]}x{dims[0]} + 2 Linear (ffn {dims[1]}) TP 2 x DP 2 -> TP 1 x DP 1", state, runs, loads)


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
