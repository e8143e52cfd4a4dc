"""`python -m bench --only fuse`: read throughput of the FUSE view against tmpfs reads of the same file.

One float32 tensor (1 GiB; 32 MiB with --quick) in a TensorStore mounted by this process, and the
same `.npy` on tmpfs (`/dev/shm`, the anchor). Every measurement runs in a fresh child process
(`python -m bench.fuse METHOD PATH BUF PASSES`: a process must not read a mount that it serves),
which reads the whole `.npy` PASSES times and reports GB/s per pass (its best counts). The rows
are measured in ROUNDS rounds, each row right after its anchor, and each figure is the ratio to
that anchor in the same round: min / median / max over the rounds. Rows:

- tmpfs: `read` of 1 MiB and 16 MiB buffers, `load_npy` (a new array each pass), `mmap`: the anchors;
- FUSE, passthrough (the shipped read-only view, `fuse.store.mount(read_only=True)`: the kernel
  protocol served without libfuse, `fuse.session`, the leaf held as a `.npy` image in a memory
  file, `store.image.put_image`): the same four reads, which the kernel serves from the memory
  file itself (no request reaches the server), each against its tmpfs anchor;
- FUSE session, plain leaf: reads of 1 MiB and 16 MiB and `mmap` of the same view's leaf held in
  ordinary memory (not an image): opened with direct I/O (`fuse.store.view.DIRECT_IO_FROM`),
  READ requests answered with one `writev` each straight into the reader's buffer; `mmap`
  through the page cache (FUSE_DIRECT_IO_ALLOW_MMAP);
- FUSE, libfuse (a writable mount, `fuse.mount` on mfusepy: splice replies, read-ahead
  `READ_AHEAD_KB`), plain leaf: the same reads (through the page cache: the kernel copies each
  byte twice, FUSE reply -> page cache -> reader) and `odirect` (O_DIRECT, 16 MiB buffer: one
  copy, into the reader's buffer), each against the tmpfs `read` with its buffer size;
  `load_npy` (O_DIRECT into the new array) and `mmap`, against the same on tmpfs;
- FUSE (libfuse) with `keep_cache`, re-read (the first pass fills the page cache and is not counted);
- bound, two copies (anchor of the limit, on tmpfs): what a buffered read through FUSE must do at
  least, done in user space: each 1 MiB read into a staging copy of the whole file (already
  faulted in: the page cache's pages cost more), then copied from there into the 1 MiB buffer. A
  buffered FUSE read that is not passed through cannot beat this row (the kernel copies each
  reply into the page cache, the reader copies it out), so its ratio is the bound of the plain
  leaves' "read 1 MiB" on this machine.

Goal (issue 16): FUSE sequential read >= 0.8x tmpfs read. FUSE rows other than keep_cache reopen
the file each pass, which drops its cached pages, so every pass goes through FUSE. memcpy
(`np.copyto`) is for information. Results: bench/results/fuse.{md,json} (fuse-quick.* with --quick).
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
PASSES, ROUNDS, QUICK_ROUNDS = 2, 3, 1
GOAL = 0.8
HEADERS = ["source", "method", "bytes", "median GB/s", "vs tmpfs read: min", "median", "max", "goal",
           "CPU s/GiB", "CPU vs tmpfs", "rounds"]  # fmt: skip
MIB = 1 << 20
R1, R16, MMAP, LOAD = ("read", MIB), ("read", 16 * MIB), ("mmap", 0), ("load_npy", 0)
# (source, method, buffer, anchor: the (method, buffer) of the tmpfs row it is divided by); a
# source names the file it reads by its first word (`_file`)
PT, PLAIN, LIBFUSE = "FUSE passthrough (.npy image)", "FUSE session, plain leaf", "FUSE libfuse, plain leaf"
SESSION = [
    ("tmpfs", *R1, None), (PT, *R1, R1), (PLAIN, *R1, R1), ("tmpfs", *R16, None), (PT, *R16, R16),
    (PLAIN, *R16, R16), ("tmpfs", *LOAD, None), (PT, *LOAD, LOAD), ("tmpfs", *MMAP, None), (PT, *MMAP, MMAP),
    (PLAIN, *MMAP, MMAP),
]  # fmt: skip
TUNED = [
    ("tmpfs", *R1, None), (LIBFUSE, *R1, R1), ("tmpfs", *R16, None), (LIBFUSE, *R16, R16),
    (LIBFUSE, "odirect", 16 * MIB, R16), ("tmpfs", *LOAD, None), (LIBFUSE, *LOAD, LOAD), ("tmpfs", *MMAP, None),
    (LIBFUSE, *MMAP, MMAP), ("bound: two copies (tmpfs)", "copy2", MIB, R1),
]  # fmt: skip
KEEP = [("tmpfs", *R1, None), ("FUSE libfuse, keep_cache re-read", *R1, R1)]


# ---- one measurement, in a fresh process ---------------------------------------------------
def measure(method: str, path: str, buf: int, passes: int) -> tuple[list[float], list[float]]:
    """GB/s and CPU seconds of each pass of `method` over the file at `path` (for memcpy: `buf` bytes)."""
    import numpy as np

    if method == "load_npy":  # `import tenplex` costs 0.5 s: only where it is measured
        from tenplex.runtime.fuse.npy import load_npy
    out, cpu = [], []
    if method == "memcpy":
        src, dst = np.ones(buf, np.uint8), np.zeros(buf, np.uint8)
    if method == "copy2":  # the staging copy, faulted in before the passes
        stage = np.ones(os.path.getsize(path), np.uint8)
    for _ in range(passes):
        t0, c0 = time.perf_counter(), time.process_time()
        if method == "memcpy":
            np.copyto(dst, src)
            n = buf
        elif method == "copy2":
            n = _read_twice(path, buf, stage)
        elif method in ("read", "odirect"):
            n = _read(path, buf, os.O_DIRECT if method == "odirect" else 0)
        elif method == "mmap":
            a = np.load(path, mmap_mode="r")
            n = np.array(a).nbytes
            del a
        elif method == "load_npy":
            n = load_npy(path).nbytes
        else:
            raise ValueError(f"unknown method {method!r}")
        out.append(n / (time.perf_counter() - t0) / 1e9)
        cpu.append(time.process_time() - c0)
    return out, cpu


def _read(path: str, size: int, flags: int) -> int:
    import mmap

    buf, n = mmap.mmap(-1, size), 0  # page-aligned, as O_DIRECT wants
    with open(os.open(path, os.O_RDONLY | flags), "rb", buffering=0) as f:
        while k := f.readinto(buf):
            n += k
    return n


def _read_twice(path: str, size: int, stage: Any) -> int:
    """`_read`, each block read into `stage` at its offset, then copied into the buffer (module doc)."""
    import mmap

    import numpy as np

    buf, n = mmap.mmap(-1, size), 0
    out, view = np.frombuffer(buf, np.uint8), memoryview(stage)
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(view[n : n + size]):
            np.copyto(out[:k], stage[n : n + k])
            n += k
    return n


# ---- the driver ------------------------------------------------------------------------------
def _measure(method: str, path: str, buf: int, timeout_s: float, skip: int = 0) -> tuple[float, float] | None:
    """(best GB/s, CPU seconds of a pass: the reader's least plus this process's share, the FUSE
    server's threads) of a child's passes, or None if it failed."""
    from bench.runner import run_json

    before = time.process_time()
    r = run_json(["bench.fuse", method, path, str(buf), str(PASSES + skip)], {}, timeout_s)
    server = (time.process_time() - before) / (PASSES + skip)
    if r["status"] != "ok":
        print(f"  {method} {path}: {r['status']} {r.get('error', '')}", file=sys.stderr)
        return None
    return max(r["gbps"][skip:]), min(r["cpu"][skip:]) + server


def _rounds(rows: list[tuple], paths: dict[str, str], rounds: int, timeout_s: float, skip: int = 0) -> list[dict]:
    """Each row's GB/s and ratio to its anchor per round (rows in order, every round)."""
    out = [{"source": s, "method": m if m in ("mmap", "load_npy") else f"{m} {b // MIB} MiB", "anchor": a,
            "gbps": [], "cpu_s": [], "ratios": [], "cpu_ratios": []} for s, m, b, a in rows]  # fmt: skip
    for _ in range(rounds):
        last: dict[tuple[str, int], tuple[float, float] | None] = {}
        for r, (source, method, buf, anchor) in zip(out, rows):
            kind = _file(source)
            got = _measure(method, paths[kind], buf, timeout_s, skip if kind != "tmpfs" else 0)
            r["gbps"].append(got and got[0])
            r["cpu_s"].append(got and got[1])
            if anchor is None:
                last[(method, buf)] = got
            elif got is not None and (ref := last.get(anchor)):
                r["ratios"].append(got[0] / ref[0])
                r["cpu_ratios"].append(ref[1] / got[1])
        print("  round done: " + ", ".join(f"{r['source']} {r['method']} {r['gbps'][-1] or 0:.2f}" for r in out),
              file=sys.stderr, flush=True)  # fmt: skip
    return out


def _file(source: str) -> str:
    """Which file a row reads: "tmpfs", "image" (the image leaf) or "plain" (the plain leaf)."""
    return "tmpfs" if not source.startswith("FUSE") else "image" if source == PT else "plain"


def measure_all(size: int, rounds: int, timeout_s: float) -> list[dict]:
    import numpy as np

    from tenplex.runtime.fuse import store as fuse
    from tenplex.runtime.store.image import put_image
    from tenplex.runtime.store.tree import TensorStore

    array = np.arange(size // 4, dtype=np.float32)
    memcpy = _measure("memcpy", "-", array.nbytes, timeout_s) or (None, None)
    rows = [{"source": "memcpy (numpy)", "method": "memcpy", "anchor": None, "ratios": [], "cpu_ratios": [],
             "gbps": [memcpy[0]], "cpu_s": [memcpy[1]]}]  # fmt: skip
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as d, tempfile.TemporaryDirectory() as mnt, TensorStore() as store:
        np.save(f"{d}/t.npy", array)
        store.put("/t", array, copy=False)
        put_image(store, "/i", array)
        files = {"tmpfs": f"{d}/t.npy", "image": "i.npy", "plain": "t.npy"}
        with fuse.mount(store, mnt, read_only=True) as m:  # the kernel protocol (fuse.session) where root
            session = _session(m)
            rows += _rounds(SESSION, {k: f if k == "tmpfs" else f"{m}/{f}" for k, f in files.items()}, rounds, timeout_s)
        with fuse.mount(store, mnt) as m:  # one mount at a time: libfuse's signal handlers are per process
            tuned = f" (read-ahead {fuse.read_ahead_of(m)} KiB)"
            rows += _rounds(TUNED, {"tmpfs": files["tmpfs"], "plain": f"{m}/t.npy"}, rounds, timeout_s)
        with fuse.mount(store, mnt, keep_cache=True) as m:
            rows += _rounds(KEEP, {"tmpfs": files["tmpfs"], "plain": f"{m}/t.npy"}, rounds, timeout_s, skip=1)
    for r in rows:
        r["source"] += (tuned if "libfuse" in r["source"] else session) if r["source"].startswith("FUSE") else ""
        r["status"] = "ok" if all(g is not None for g in r["gbps"]) else "error"
        r["error"] = None if r["status"] == "ok" else "a measurement failed (its error is on stderr)"
    return [{**r, "bytes": array.nbytes} for r in rows]


def _session(mounted: str) -> str:
    """How the read-only view was served: " (kernel protocol)" where `fuse.session` mounted it
    (its file system type is fuse.tenplex), else " (libfuse: no passthrough)"."""
    from tenplex.runtime.fuse.mount import mount_type

    return " (kernel protocol)" if mount_type(mounted) == "fuse.tenplex" else " (libfuse: no passthrough)"


def row_cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    if r["status"] != "ok":
        return [r["source"], r["method"], r["status"].upper()] + [""] * (len(HEADERS) - 3)
    q, c = r["ratios"], r["cpu_ratios"]
    ratio = [f"{min(q):.2f}x", f"{statistics.median(q):.2f}x", f"{max(q):.2f}x"] if q else ["", "", ""]
    goal = "" if not q or r["source"].startswith("bound") else ("met" if statistics.median(q) >= GOAL else "MISSED")
    cpu = statistics.median(r["cpu_s"]) / (r["bytes"] / (1 << 30))
    return [r["source"], r["method"], fmt_bytes(r["bytes"]), f"{statistics.median(r['gbps']):.2f}", *ratio, goal,
            f"{cpu:.2f}", f"{statistics.median(c):.2f}x" if c else "", str(len(r["gbps"]))]  # fmt: skip


def markdown(info: dict[str, Any], cells: list[list[str]], load: tuple[float, float]) -> str:
    from bench.report import md_table

    return "\n".join([
        "# FUSE read benchmark (`python -m bench --only fuse`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        "One float32 `.npy` read whole by a fresh child process per figure (best of its passes); each FUSE "
        "figure is divided by the tmpfs figure measured just before it, and the ratios of the rounds are "
        f"given as min / median / max (load average {load[0]:.1f} before, {load[1]:.1f} after). CPU s/GiB: "
        "the reader's CPU time per pass plus the FUSE server's (this process, averaged over the passes), per GiB; CPU vs tmpfs: the "
        "anchor's CPU time over the row's (median), a figure that a busy machine disturbs less than GB/s.", "",
        f"Goal: FUSE >= {GOAL}x tmpfs read. See the docstring of bench/fuse.py for the methods.", "",
        md_table(HEADERS, cells), "",
    ])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import text_table, write_results

    print("FUSE reads (one child process per figure):", file=sys.stderr)
    load = os.getloadavg()[0]
    rows = measure_all(QUICK_SIZE if quick else SIZE, QUICK_ROUNDS if quick else ROUNDS, timeout_s)
    load = (load, os.getloadavg()[0])
    cells = [row_cells(r) for r in rows]
    print(f"\nFUSE reads vs tmpfs reads (goal: >= {GOAL}x; ratios to the anchor of the same round)")
    print(text_table(HEADERS, cells) + "\n", flush=True)
    for r in rows:
        r["name"] = f"{r['source']}: {r['method']}"  # for bench.__main__._verdict
    doc = {"machine": info, "load_average": load, "fuse": rows}
    return rows, write_results(out_dir, "fuse-quick" if quick else "fuse", doc, markdown(info, cells, load))


if __name__ == "__main__":
    method, path, buf, passes = sys.argv[1:5]
    gbps, cpu = measure(method, path, int(buf), int(passes))
    print(json.dumps({"gbps": gbps, "cpu": cpu}))
