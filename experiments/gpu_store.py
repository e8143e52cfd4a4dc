"""CUDA state through a tenplex store with DCP's own API, on a machine with a GPU.

    python experiments/gpu_store.py [--mib 1024] [--repeats 3] [--device cuda]

One agent (`tenplex agent --local`) on this machine; a state dict of CUDA tensors (bf16 weights,
fp32 Adam moments, a 0-d step, a bytes entry) is saved with `dcp.save(storage_writer=StoreWriter)`
and loaded back into fresh CUDA tensors with `StoreReader`, checked bit for bit on the GPU, then
loaded again with different shapes of target chunks (row halves: DCP's load-time reshard from the
store). Beside it, in the same run and alternating, the same state through DCP's own
`FileSystemWriter`/`FileSystemReader` in /dev/shm. Prints min/median/max seconds and GB/s of each
and the ratio store / files. Exit 1 when any byte differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from tenplex.frameworks.dcp import StoreReader, StoreWriter


def _state(mib: int, device: str) -> dict:
    rows = max(1, (mib << 20) // (4096 * (2 + 4 + 4)))  # bf16 weight + two fp32 moments per element
    g = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(rows, 4096, device=device, generator=g).to(torch.bfloat16)
    return {
        "model": {"weight": weight, "bias": torch.randn(4096, device=device, generator=g)},
        "optim": {"exp_avg": torch.randn(rows, 4096, device=device, generator=g),
                  "exp_avg_sq": torch.rand(rows, 4096, device=device, generator=g),
                  "step": torch.tensor(7.0, device=device)},
        "extra": {"note": "bytes entries travel as values"},
    }  # fmt: skip


def _empty_like(state: dict) -> dict:
    return {k: (_empty_like(v) if isinstance(v, dict) else torch.zeros_like(v) if torch.is_tensor(v) else None)
            for k, v in state.items()}  # fmt: skip


def _same(a: dict, b: dict) -> bool:
    for k, v in a.items():
        w = b[k]
        if isinstance(v, dict):
            if not _same(v, w):
                return False
        elif torch.is_tensor(v):
            if w.device != v.device or w.dtype != v.dtype or not torch.equal(v.view(torch.uint8) if v.dim() else v, w.view(torch.uint8) if w.dim() else w):
                return False
        elif v != w:
            return False
    return True


def _nbytes(state: dict) -> int:
    return sum(_nbytes(v) if isinstance(v, dict) else v.numel() * v.element_size() if torch.is_tensor(v) else 0
               for v in state.values())  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu runs the same checks without a GPU")
    args = ap.parse_args(argv)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    run = Path(tempfile.mkdtemp(prefix="tpx-gpu-", dir="/dev/shm"))
    sock = str(run / "h0.store")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    agent = subprocess.Popen([sys.executable, "-m", "tenplex.cli", "agent", "--name", "h0", "--control", str(run / "h0.sock"),
                              "--local", sock], env=env)  # fmt: skip
    try:
        for _ in range(600):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        state = _state(args.mib, args.device)
        n = _nbytes(state)
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        print(f"{name}: state {n / 1e9:.2f} GB of {args.device} tensors (bf16 + fp32 + 0-d)")
        times: dict[str, list[float]] = {k: [] for k in ("store save", "files save", "store load", "files load")}
        ok = True
        for r in range(args.repeats):
            files = run / f"files-{r}"
            for side in ("store", "files") if r % 2 == 0 else ("files", "store"):
                sync()
                t = time.perf_counter()
                if side == "store":
                    dcp.save(state, storage_writer=StoreWriter(sock, job="gpu", tag=f"t{r}"))
                else:
                    dcp.save(state, storage_writer=dcp.FileSystemWriter(files))
                sync()
                times[f"{side} save"].append(time.perf_counter() - t)
                got = _empty_like(state)
                got["extra"] = {"note": None}
                sync()
                t = time.perf_counter()
                reader = StoreReader(sock, job="gpu", tag=f"t{r}") if side == "store" else dcp.FileSystemReader(files)
                dcp.load(got, storage_reader=reader)
                sync()
                times[f"{side} load"].append(time.perf_counter() - t)
                same = _same(state, got)
                ok &= same
                print(f"repeat {r} {side}: save {times[f'{side} save'][-1]:.3f} s, load {times[f'{side} load'][-1]:.3f} s, bit-equal {same}")
            shutil.rmtree(files)
        print("\nphase        min      median   max      GB/s(median)")
        for k, v in times.items():
            print(f"{k:11}  {min(v):.3f}  {statistics.median(v):.3f}  {max(v):.3f}  {n / statistics.median(v) / 1e9:.2f}")
        for op in ("save", "load"):
            print(f"store/files {op} time (median): {statistics.median(times[f'store {op}']) / statistics.median(times[f'files {op}']):.2f}x")
        print("all bit-equal:", ok)
        return 0 if ok else 1
    finally:
        agent.terminate()
        agent.wait(10)
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
