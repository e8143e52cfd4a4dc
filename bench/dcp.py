"""`python -m bench --only dcp [--quick]`: PyTorch DCP load-time resharding vs `tenplex reshard_dcp`.

Source: a DCP checkpoint (written by tenplex's `write_dcp`, which DCP reads like its own) of a
GPT-like state — per layer a [4096, 4096] fp32 weight and its two Adam moments (+ step
scalars and a few bytes entries), 11 layers = 2.06 GiB (--quick: [1024, 1024], 3 layers) —
in layout A: a 1-D mesh of 4 ranks, every matrix Shard(0). Per case, one after the other on one
machine, page cache warm for both (the source was just written; nothing is dropped):

- DCP: W' forked gloo CPU processes build zero DTensors in layout B and call
  `torch.distributed.checkpoint.load` on the source (its load-time resharding). Time: from a
  barrier before `load` to the last rank's return (process start and allocation excluded).
- tenplex load: the same W' processes call tenplex's `load_dcp` instead (same DTensors, same
  timing): a compiled plan copies each needed region once from the memory-mapped files.
- tenplex reshard: `reshard_dcp(src, B, out)` in this process (read, compile, execute, write
  with fsync), then the W' processes `dcp.load` tenplex's output (no resharding left): the
  offline alternative, end to end.

Each case runs 3 times, the three measurements interleaved (DCP, tenplex load, tenplex reshard
+ load, DCP, ...); each ratio is taken within one repeat and shown min/median/max, because
other jobs share the machine. Checked: for a sample of tensors (first and last layer weight, a moment, a step) every rank's
local bytes from all three loads equal the arange oracle. Results: bench/results/dcp.{md,json}
(dcp-quick.* with --quick).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import fmt_bytes, md_table, text_table, write_results

SIDE, LAYERS, QUICK_SIDE, QUICK_LAYERS = 4096, 11, 1024, 3
SRC_MESH = 4
CASES = [  # name, dst layout, W'
    ("rows/4 -> cols/4", {"mesh": [4], "placements": {"*": ["S(1)"]}}, 4),
    ("rows/4 -> rows/2", {"mesh": [2]}, 2),
]
HEADERS = ["case", "state", "DCP deserializes", "DCP load s (med)", "DCP / tenplex load_dcp (min/med/max)",
           "tenplex reshard s (med)", "(read/compile/exec/write)", "then DCP load s (med)",
           "DCP / (reshard + load) (min/med/max)", "goal ≥ 1x", "checked"]  # fmt: skip
LOADS = ("dcp", "tenplex", "aligned")  # DCP on the source, load_dcp on the source, DCP on tenplex's output
TIMEOUT_S = 600.0
REPEATS = 3


def global_array(name: str, shape: tuple[int, ...], index: int) -> np.ndarray:
    """The deterministic content of tensor `name` (the oracle)."""
    n = math.prod(shape)
    return ((np.arange(n, dtype=np.int64) % 65521).astype(np.float32) + index).reshape(shape)


def tensors(quick: bool) -> dict[str, tuple[int, ...]]:
    side, layers = (QUICK_SIDE, QUICK_LAYERS) if quick else (SIDE, LAYERS)
    out: dict[str, tuple[int, ...]] = {}
    for i in range(layers):
        out[f"model.layers.{i}.weight"] = (side, side)
        for kind in ("exp_avg", "exp_avg_sq"):
            out[f"optim.state.layers.{i}.weight.{kind}"] = (side, side)
        out[f"optim.state.layers.{i}.weight.step"] = ()
    return out


def write_source(root: Path, quick: bool) -> int:
    """Layout A (1-D mesh of 4, Shard(0); scalars replicated) written as DCP; returns bytes."""
    from tenplex.frameworks.dcp.write import write_dcp
    from tenplex.frameworks.dtensor.boxes import Replicate, Shard
    from tenplex.frameworks.dtensor.layout import TensorSpec, ptc_from_specs, subtensor_id
    from tenplex.ir.tensor import TensorMeta

    specs, arrays = [], {}
    for i, (name, shape) in enumerate(tensors(quick).items()):
        spec = TensorSpec(TensorMeta(name, shape, "float32"), (SRC_MESH,), [Shard(0) if shape else Replicate()])
        full = global_array(name, shape, i)
        for rank, box in spec.boxes().items():
            arrays[subtensor_id(name, rank)] = full[box.to_slices()]
        specs.append(spec)
    values = {"step": 1000, "optim.param_groups.0.lr": 3e-4, "optim.param_groups.0.betas": (0.9, 0.95)}
    ptc = ptc_from_specs(SRC_MESH, specs, values)
    write_dcp(ptc, arrays, {p.id: values for p in ptc.partitions}, root, sync=False)
    return sum(t.nbytes for t in ptc.tensors)


# ---- DCP's load in W' forked gloo processes -------------------------------------------------
def dcp_load(src: Path, ckpt: Path, layout: dict, world: int, tmp: Path, tag: str, sample: list[str]) -> float:
    """Seconds from the barrier before the load (`dcp.load`, or tenplex's `load_dcp` for tag
    "tenplex") to the last rank's return; each rank saves its local arrays of `sample` as
    tmp/<tag>.<rank>.<fqn>.npy."""
    (tmp / f"{tag}.store").unlink(missing_ok=True)  # gloo's file store: a new one per load
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(r, world, src, ckpt, layout, tmp, tag, sample), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    errors = [(tmp / f"{tag}.err{r}").read_text() for r in range(world) if (tmp / f"{tag}.err{r}").exists()]
    if errors or any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"DCP load ranks failed (exit codes {[p.exitcode for p in procs]}): {errors[:1]}")
    times = [json.loads((tmp / f"{tag}.{r}.json").read_text()) for r in range(world)]
    return max(t["end"] for t in times) - min(t["start"] for t in times)


def _worker(rank: int, world: int, src: Path, ckpt: Path, layout: dict, tmp: Path, tag: str, sample: list[str]) -> None:
    code = 0
    try:
        import torch

        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/{tag}.store", rank=rank, world_size=world)
        _load_rank(rank, src, ckpt, layout, tmp, tag, sample)
        torch.distributed.destroy_process_group()
    except BaseException:  # noqa: BLE001 (reported to the parent through a file)
        (tmp / f"{tag}.err{rank}").write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def _load_rank(rank: int, src: Path, ckpt: Path, layout: dict, tmp: Path, tag: str, sample: list[str]) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from tenplex.frameworks.dcp.load import load_dcp
    from tenplex.frameworks.dcp.read import ptc_of_index, read_index
    from tenplex.frameworks.dtensor.convert import to_numpy
    from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_specs

    ml = MeshLayout.from_json(layout)
    src_ptc = ptc_of_index(read_index(src))
    mesh = init_device_mesh("cpu", ml.mesh)
    sd: dict[str, Any] = dict.fromkeys({n for p in src_ptc.partitions for n, _ in p.values})
    for spec in dst_specs(src_ptc, ml):
        box = spec.box_of_rank(rank)
        placements = [Shard(p.dim) if hasattr(p, "dim") else Replicate() for p in spec.placements]
        local = torch.zeros(box.shape, dtype=torch.float32)
        stride = tuple(math.prod(spec.meta.shape[d + 1 :]) for d in range(len(spec.meta.shape)))
        sd[spec.name] = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(spec.meta.shape), stride=stride)
    torch.distributed.barrier()
    start = time.time()
    if tag == "tenplex":
        load_dcp(sd, ckpt)
    else:
        dcp.load(sd, checkpoint_id=str(ckpt))
    end = time.time()
    torch.distributed.barrier()
    (tmp / f"{tag}.{rank}.json").write_text(json.dumps({"start": start, "end": end}))
    for fqn in sample:
        np.save(tmp / f"{tag}.{rank}.{fqn}.npy", to_numpy(sd[fqn].to_local()))


# ---- one case -------------------------------------------------------------------------------
def run_case(name: str, layout: dict, world: int, src: Path, tmp: Path, quick: bool, repeat: int) -> dict[str, Any]:
    """Each measurement `repeat` times, interleaved; the row keeps the best (least disturbed by
    other load on the machine) and every sample."""
    from tenplex.frameworks.dcp.reshard import reshard_dcp

    names = list(tensors(quick))
    sample = [names[0], names[-4], names[-2], names[-1]]
    runs: dict[str, list] = {"dcp": [], "tenplex": [], "reshard": [], "aligned": []}
    for _ in range(repeat):
        runs["dcp"].append(dcp_load(src, src, layout, world, tmp, "dcp", sample))
        runs["tenplex"].append(dcp_load(src, src, layout, world, tmp, "tenplex", sample))
        out = tmp / "out"
        shutil.rmtree(out, ignore_errors=True)
        runs["reshard"].append(reshard_dcp(src, layout, out).seconds)
        runs["aligned"].append(dcp_load(src, out, layout, world, tmp, "aligned", sample))
    totals = [sum(ph.values()) for ph in runs["reshard"]]
    return {"name": name, "layout": layout, "world": world, "samples": runs,
            "load_ratio": [d / t for d, t in zip(runs["dcp"], runs["tenplex"])],
            "offline_ratio": [d / (r + a) for d, r, a in zip(runs["dcp"], totals, runs["aligned"])],
            "checked_bytes": check(src, layout, world, tmp, sample, quick),
            "dcp_deserialized_bytes": deserialized_bytes(src, layout), "status": "ok"}  # fmt: skip


def deserialized_bytes(src: Path, layout: dict) -> int:
    """Bytes DCP's load `torch.load`s: every saved chunk once per local shard it overlaps (DCP
    reads a whole chunk for each read item, then narrows it)."""
    from tenplex.frameworks.dcp.read import ptc_of_index, read_index
    from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_specs

    index = read_index(src)
    total = 0
    for spec in dst_specs(ptc_of_index(index), MeshLayout.from_json(layout)):
        chunks = [e.box for e in index.entries if e.fqn == spec.name and e.box is not None]
        for box in spec.boxes().values():
            total += sum(c.volume * 4 for c in chunks if c.overlaps(box))
    return total


def check(src: Path, layout: dict, world: int, tmp: Path, sample: list[str], quick: bool) -> int:
    """Bytes compared with the oracle: every load in LOADS, per rank and sample."""
    from tenplex.frameworks.dcp.read import ptc_of_index, read_index
    from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_specs

    specs = {s.name: s for s in dst_specs(ptc_of_index(read_index(src)), MeshLayout.from_json(layout))}
    index = {n: i for i, n in enumerate(tensors(quick))}
    n = 0
    for fqn in sample:
        full = global_array(fqn, specs[fqn].meta.shape, index[fqn])
        for r in range(world):
            want = full[specs[fqn].box_of_rank(r).to_slices()].tobytes()
            wrong = [tag for tag in LOADS if np.load(tmp / f"{tag}.{r}.{fqn}.npy").tobytes() != want]
            if wrong:
                raise AssertionError(f"{fqn} on rank {r}: loads {wrong} differ from the oracle")
            n += len(LOADS) * len(want)
    return n


# ---- report ---------------------------------------------------------------------------------
def _med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{xs[0]:.2f}/{_med(xs):.2f}/{xs[-1]:.2f}x"


def row_cells(r: dict[str, Any], state: int) -> list[str]:
    runs = r["samples"]
    phases = "/".join(f"{_med([ph[k] for ph in runs['reshard']]):.2f}" for k in ("read", "compile", "execute", "write"))
    met = "met" if _med(r["offline_ratio"]) >= 1 else "MISSED"
    return [r["name"], fmt_bytes(state), fmt_bytes(r["dcp_deserialized_bytes"]), f"{_med(runs['dcp']):.2f}",
            _spread(r["load_ratio"]), f"{_med([sum(ph.values()) for ph in runs['reshard']]):.2f}", phases,
            f"{_med(runs['aligned']):.2f}", _spread(r["offline_ratio"]), met, fmt_bytes(r["checked_bytes"])]  # fmt: skip


def markdown(info: dict[str, Any], rows: list[dict], state: int, quick: bool) -> str:
    head = __doc__.split("\n\n", 1)[1].strip()
    return "\n".join([f"# DCP resharding (`python -m bench --only dcp{' --quick' if quick else ''}`)", "",
                      f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']}); "
                      f"load average {info['loadavg_before'][0]:.1f} before, {info['loadavg_after'][0]:.1f} after (other jobs share the machine); "
                      f"{info['repeat']} repeats per case, every sample in the JSON", "",
                      head, "", "Goal (issue 16): tenplex reshard + DCP load ≥ 1× as fast as DCP's load-time reshard (stretch 2×).", "",
                      md_table(HEADERS, [row_cells(r, state) for r in rows]), ""])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    info = {**info, "loadavg_before": os.getloadavg(), "repeat": REPEATS}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dcp-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        state = write_source(tmp / "A", quick)
        print(f"source: {fmt_bytes(state)} in layout A (1-D mesh of {SRC_MESH}, Shard(0)), written in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr, flush=True)  # fmt: skip
        for name, layout, world in CASES:
            try:
                rows.append(run_case(name, layout, world, tmp / "A", tmp, quick, REPEATS))
            except (RuntimeError, AssertionError) as e:
                rows.append({"name": name, "status": "error", "error": str(e)})
    info["loadavg_after"] = os.getloadavg()
    ok = [r for r in rows if r["status"] == "ok"]
    print(text_table(HEADERS, [row_cells(r, state) for r in ok]), flush=True)
    stem = "dcp-quick" if quick else "dcp"
    return rows, write_results(out_dir, stem, {"machine": info, "state_bytes": state, "dcp": rows}, markdown(info, ok, state, quick))


if __name__ == "__main__":
    from bench.__main__ import main

    sys.exit(main(["--only", "dcp", *sys.argv[1:]]))
