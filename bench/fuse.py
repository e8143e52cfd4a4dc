"""`python -m bench --only fuse`: read throughput of the FUSE view beside memcpy and the page cache.

One float32 tensor (1 GiB; 32 MiB with --quick) in a TensorStore mounted by this process; every
measurement runs in a fresh child process (`python -m bench.fuse METHOD PATH BUF PASSES`: a
process must not read a mount that it serves), which reads the whole `.npy` PASSES times and
reports GB/s per pass. Rows, side by side:

- memcpy: `np.copyto` of the same number of bytes into a preallocated buffer;
- page cache: the same `.npy` on tmpfs (`/dev/shm`);
- FUSE, kernel defaults: the mount with FUSE's initial read-ahead (128 KiB);
- FUSE, tuned: `fuse.mount` as shipped (read-ahead `READ_AHEAD_KB`), plus `load_npy` (O_DIRECT)
  and a re-read with `keep_cache` (served from the page cache after the first pass).

Methods: `read` = `readinto` of a BUF-byte buffer until EOF (unbuffered file); `mmap` =
`np.load(mmap_mode="r")` + copy into a new array; `load_npy` = `tenplex.runtime.fuse.load_npy`.
FUSE rows other than keep_cache reopen the file each pass, which drops its cached pages, so every
pass goes through FUSE. Results: bench/results/fuse.{md,json} (fuse-quick.* with --quick).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZE, QUICK_SIZE = 1 << 30, 32 << 20
PASSES, QUICK_PASSES = 5, 2
HEADERS = ["source", "method", "bytes", "best GB/s", "median GB/s", "vs memcpy", "passes"]
MIB = 1 << 20


# ---- one measurement, in a fresh process ---------------------------------------------------
def measure(method: str, path: str, buf: int, passes: int) -> list[float]:
    """GB/s of each pass of `method` over the file at `path` (for memcpy: `buf` bytes)."""
    import numpy as np

    if method == "load_npy":  # `import tenplex` costs 0.5 s: only where it is measured
        from tenplex.runtime.fuse.npy import load_npy
    out = []
    if method == "memcpy":
        src, dst = np.ones(buf, np.uint8), np.zeros(buf, np.uint8)
    for _ in range(passes):
        t0 = time.perf_counter()
        if method == "memcpy":
            np.copyto(dst, src)
            n = buf
        elif method == "read":
            n = _read(path, bytearray(buf))
        elif method == "mmap":
            a = np.load(path, mmap_mode="r")
            n = np.array(a).nbytes
            del a
        elif method == "load_npy":
            n = load_npy(path).nbytes
        else:
            raise ValueError(f"unknown method {method!r}")
        out.append(n / (time.perf_counter() - t0) / 1e9)
    return out


def _read(path: str, buf: bytearray) -> int:
    n = 0
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            n += k
    return n


# ---- the driver ------------------------------------------------------------------------------
def _row(source: str, method: str, path: str, buf: int, passes: int, timeout_s: float, skip: int = 0) -> dict:
    from bench.runner import progress, run_json

    label = method if method != "read" else f"read {buf // MIB} MiB"
    row = {"source": source, "method": label, "passes": passes}
    r = run_json(["bench.fuse", method, path, str(buf), str(passes)], row, timeout_s)
    if r["status"] == "ok":
        gbps = r.pop("gbps")[skip:]
        r |= {"best_gbps": max(gbps), "median_gbps": statistics.median(gbps), "gbps": gbps}
    progress(r, f"{source}: {label}")
    return r


def measure_all(size: int, passes: int, timeout_s: float) -> list[dict]:
    import numpy as np

    from tenplex.runtime.fuse import store as fuse
    from tenplex.runtime.store.tree import TensorStore

    array = np.arange(size // 4, dtype=np.float32)
    reads = [("read", MIB), ("read", 16 * MIB), ("mmap", 0)]
    rows = [_row("memcpy (numpy)", "memcpy", "-", array.nbytes, passes, timeout_s)]
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as d, TensorStore() as store:
        np.save(f"{d}/t.npy", array)
        rows += [_row(f"page cache ({shm or 'tmp'})", m, f"{d}/t.npy", b, passes, timeout_s) for m, b in reads]
        os.unlink(f"{d}/t.npy")
        store.put("/t", array, copy=False)
        with fuse.mount(
            store, d, read_ahead_kb=None
        ) as m:  # one mount at a time: libfuse's signal handlers are per process
            source = f"FUSE, kernel defaults (read-ahead {fuse.read_ahead_of(m)} KiB)"
            rows += [_row(source, how, f"{m}/t.npy", b, passes, timeout_s) for how, b in reads]
        with fuse.mount(store, d) as m:
            source = f"FUSE, tuned (read-ahead {fuse.read_ahead_of(m)} KiB)"
            rows += [_row(source, how, f"{m}/t.npy", b, passes, timeout_s) for how, b in [*reads, ("load_npy", 0)]]
        with fuse.mount(store, d, keep_cache=True) as m:  # pass 1 fills the page cache: not counted
            rows.append(_row(source + ", keep_cache re-read", "read", f"{m}/t.npy", MIB, passes + 1, timeout_s, skip=1))
    return [{**r, "bytes": array.nbytes} for r in rows]


def row_cells(r: dict[str, Any], memcpy: float | None) -> list[str]:
    from bench.report import fmt_bytes

    if r["status"] != "ok":
        return [r["source"], r["method"], r["status"].upper(), "", "", "", r.get("error", "")[:60]]
    ratio = f"{r['best_gbps'] / memcpy:.2f}x" if memcpy else ""
    return [r["source"], r["method"], fmt_bytes(r["bytes"]), f"{r['best_gbps']:.2f}", f"{r['median_gbps']:.2f}",
            ratio, str(len(r["gbps"]))]  # fmt: skip


def markdown(info: dict[str, Any], rows: list[dict], cells: list[list[str]], load: tuple[float, float]) -> str:
    from bench.report import md_table

    return "\n".join([
        "# FUSE read benchmark (`python -m bench --only fuse`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        "One float32 `.npy` read whole by a fresh child process per row; GB/s per pass, best and median "
        f"(load average {load[0]:.1f} before, {load[1]:.1f} after: figures vary ±30-50% run to run on a shared "
        "machine, so compare rows of one run). "
        "See the docstring of bench/fuse.py for the methods.", "",
        md_table(HEADERS, cells), "",
    ])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import text_table

    print("FUSE reads (one child process per row):", file=sys.stderr)
    load = os.getloadavg()[0]
    rows = measure_all(QUICK_SIZE if quick else SIZE, QUICK_PASSES if quick else PASSES, timeout_s)
    load = (load, os.getloadavg()[0])
    memcpy = rows[0].get("best_gbps")
    cells = [row_cells(r, memcpy) for r in rows]
    print("\nFUSE reads vs memcpy and the page cache (GB/s, best and median of the passes)")
    print(text_table(HEADERS, cells) + "\n", flush=True)
    for r in rows:
        r["name"] = f"{r['source']}: {r['method']}"  # for bench.__main__._verdict
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "fuse-quick" if quick else "fuse"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(
        json.dumps({"machine": info, "load_average": load, "fuse": rows}, indent=2, sort_keys=True) + "\n"
    )
    paths[1].write_text(markdown(info, rows, cells, load))
    return rows, paths


if __name__ == "__main__":
    method, path, buf, passes = sys.argv[1:5]
    print(json.dumps({"gbps": measure(method, path, int(buf), int(passes))}))
