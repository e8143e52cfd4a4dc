"""`python -m bench --only dataset`: reading one rank's samples, and the first batch after a rescale.

Throughput (one table row per sample size and path): a raw dataset of equal samples in one file
on tmpfs (`/dev/shm`, so every path reads from the page cache), rank 0 of W = 2 reading its
share of one epoch (global batch 16). Each pass runs in a fresh child process
(`python -m bench.dataset_pass METHOD ...`) that reports seconds, samples, bytes and a sha256
of the (id, bytes) sequence; all paths must agree on it. Paths:
- direct: `os.pread` of each sample's byte range from the open source file;
- batches, 0 / 2 workers: `tenplex.data.torch_data.RankBatches(SampleReader(decode=False),
  workers=...)`: DataLoader workers read chunks of steps into shared memory, each sample a numpy
  view; timed from the first sample (worker start-up is reported apart);
- DataLoader per sample, 2 workers: `RankIterableDataset` in `DataLoader(batch_size=None)`, one
  pickled (id, bytes) message per sample (the path `RankBatches` replaces; for comparison);
- FUSE: `tenplex.runtime.fuse.dataset.mount` served by the driver, the child opens and reads every
  `step-*/NNN-ID.bin` in order (a fresh mount per pass: no page cache left from the last pass);
- anchor "the view's files on tmpfs": the same files copied from the view to tmpfs beforehand
  (not timed) and read by the same child code: what a reader pays for a file per sample (listing,
  open, read, close) with no server at all, the bound of any per-file view, FUSE or not;
- FUSE, a file per step: the same mount, the child reads every `step-SSSSSS.bin` (the rank's
  samples of a step after a table of their ids and offsets) with one open and one read
  (`tenplex.data.step_file.read`), each sample a view of what it read;
- anchor "the view's step files on tmpfs": those step files copied to tmpfs, read the same way;
- anchor "the view's ranges, sources direct": `ranges.bin` copied to tmpfs beside links to the
  dataset's own files, read the same way as the next path with no server: what the ranges
  reader itself costs against direct;
- FUSE, ranges + sources: the same mount, the child reads `ranges.bin` (where the view's samples
  lie) once, then each sample with one `preadv` from `sources/FFFFFF`, its source file as the
  view shows it (`tenplex.data.ranges_file.RangesReader`); as root the view is served in the
  kernel's protocol and the sources are passed through (FUSE passthrough): no READ reaches the
  server.
Goals (issue 16): FUSE (any layout) and RankBatches with 2 workers ≥ 0.8× direct for samples ≥ 64 KiB, judged on
the median of the per-round ratios (rounds run every path once, right after direct). 4 KiB samples
are for information.

Rescale (`bench/dataset_rescale.py`): time from a switch W = 4 → 2 to the first batch being
ready on every new rank, with and without the prefetcher. Results: bench/results/dataset.{md,json}
(dataset-quick.* with --quick).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

KIB, MIB = 1 << 10, 1 << 20
SIZES = ((4 * KIB, 32 * MIB), (64 * KIB, 256 * MIB), (MIB, 512 * MIB))  # sample size, dataset bytes
QUICK_SIZES = ((64 * KIB, 16 * MIB),)  # one size: every path, in a few seconds
PASSES, QUICK_PASSES = 3, 1
GLOBAL_BATCH, WORLD, RANK, GOAL = 16, 2, 0, 0.8
METHODS = (("direct", "direct os.pread"), ("ring", "anchor: direct into a 64 MiB ring"),
           ("ring2", "anchor: the same, 2 processes at once"),
           ("batches0", "RankBatches, 0 workers"), ("batches2", "RankBatches, 2 workers"),
           ("loader2", "DataLoader per sample, 2 workers"), ("bound", "anchor: direct + 2 round trips/file"),
           ("files", "anchor: the view's files on tmpfs"), ("fuse", "FUSE view (child process)"),
           ("stepfiles", "anchor: the view's step files on tmpfs"), ("fusestep", "FUSE view, a file per step"),
           ("rangesfiles", "anchor: the view's ranges, sources direct"), ("fuseranges", "FUSE view, ranges + sources"))  # fmt: skip
ANCHORS = ("direct", "ring", "ring2", "bound", "files", "stepfiles", "rangesfiles")
_MOUNTED = ("fuse", "files", "fusestep", "stepfiles", "rangesfiles", "fuseranges")  # passes that read a fresh mount (or a copy of it)
HEADERS = ["sample", "path", "samples", "bytes", "best samples/s", "best MB/s", "median MB/s",
           "vs direct: min / median / max", "start-up s", "goal"]  # fmt: skip


NOTES = """Where the time goes. FUSE view: a sample file costs two requests on the reader's path
(OPEN, READ; RELEASE is not waited for; the listing carries the attributes, READDIRPLUS, so there
is no LOOKUP), each a trip from the kernel through libfuse's high-level API and mfusepy's ctypes
callbacks into Python and two switches between the reader and the server process, so small
files are bound by requests, not bytes. Sample files from 256 KiB on are opened with direct I/O:
the kernel copies a reply once, into the reader's buffer (through the page cache it copies twice
and fills fresh pages), at the price of one more READ where the reader looks for EOF (`f.read()`
of a 1 MiB file: READs of 1008 KiB and 16 KiB, then one that returns 0). Bytes are spliced from
the source file's page cache into the reply; the server copies nothing. The anchor "direct + 2
round trips/file" adds two process round trips (a pipe ping-pong measured in the same round) to
direct's time per file: what a server answering in zero time could reach on this machine, one
bound of the FUSE row; the anchor "the view's files on tmpfs" is the other: the same files read
by the same code with no server at all (the reader's own listing, open and close per file cost
direct about a third at 64 KiB here), so no file-per-sample view reaches more. RankBatches: workers read chunks of steps (about 4 MiB) into shared
buffers and send only (chunk, slot) through the DataLoader, so the training process never copies
or unpickles a sample; one worker stream serves every pass (no DataLoader restart per epoch).
A file per step (`step-SSSSSS.bin`): two requests per step on the reader's path (OPEN, and one READ per MiB,
libfuse's largest request) instead of two per sample; the reply is gathered by splice from wherever the step's
samples lie in the source, direct I/O; the reader keeps one buffer (`step_file.StepReader`). Its anchor, the
step files on tmpfs, shows the layout costs a reader nothing measurable: what is left is the server's Python
callback per request. The anchor "direct into a 64 MiB ring" reads the samples in one process into memory that has
left the CPU cache, as every batch that waits for its step must; direct's `os.pread` gets a
buffer back warm from the cache each time. The per-sample DataLoader pickles every (id, bytes)
pair through a pipe. Ranges + sources: the reader asks the view once per pass where its samples
lie (`ranges.bin`: an OPEN and a READ) and opens each source file once; every sample is then a
`preadv` of a source file that the kernel passes through to the file itself (as root; Linux >= 6.9),
so no request reaches the server per sample or per step: the view's server is out of the data path."""


# ---- the driver ----------------------------------------------------------------------------
def make_dataset(root: Path, sample: int, total: int) -> tuple[str, str]:
    """A raw file of total // sample samples, its index and start state; (index path, state path)."""
    import numpy as np

    from tenplex.data import DatasetIndex, DataState

    n = total // sample
    data = np.random.default_rng(sample).integers(0, 256, n * sample, dtype=np.uint8)
    (root / "data.bin").write_bytes(data.tobytes())
    index = DatasetIndex.from_files(
        "raw", str(root), [("data.bin", n * sample, np.arange(n) * sample, np.full(n, sample))]
    )
    index.save(root / "index.npz")
    DataState.start(index, 1, GLOBAL_BATCH).save(root / "state.json")
    return str(root / "index.npz"), str(root / "state.json")


def _pass(method: str, index_path: str, state_path: str, mnt: Path, timeout_s: float) -> dict[str, Any]:
    from bench.runner import run_json

    argv = ["bench.dataset_pass", method, index_path, state_path, str(mnt)]
    if method not in _MOUNTED:
        return run_json(argv, {}, timeout_s)
    import shutil

    from tenplex.data import DatasetIndex, DataState
    from tenplex.runtime.fuse.dataset import mount

    index = DatasetIndex.load(index_path)
    with mount(index, DataState.load(state_path), WORLD, RANK, mnt):  # fresh: no cached pages
        if method in ("fuse", "fusestep", "fuseranges"):
            return run_json(argv, {}, timeout_s)
        with tempfile.TemporaryDirectory(dir=Path(index_path).parent) as tree:  # tmpfs, as the dataset
            # not timed: the view's files as plain files; its sources are the dataset's own files
            shutil.copytree(mnt, tree, dirs_exist_ok=True, ignore=lambda d, names: ["sources"] if d == str(mnt) else [])
            os.mkdir(Path(tree) / "sources")
            for k in range(len(index.files)):
                os.symlink(index.location(k), Path(tree) / "sources" / f"{k:06d}")
            return run_json([*argv[:-1], tree], {}, timeout_s)


def measure_size(sample: int, total: int, passes: int, timeout_s: float) -> list[dict[str, Any]]:
    from bench.report import fmt_bytes

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as d, tempfile.TemporaryDirectory() as mnt:
        index_path, state_path = make_dataset(Path(d), sample, total)
        rows = [{"name": f"{fmt_bytes(sample)} {label}", "sample_bytes": sample, "method": method, "path": label,
                 "runs": [], "error": _unavailable(method)} for method, label in METHODS]  # fmt: skip
        for _ in range(passes):  # rounds: every path once, right after direct
            for row in rows:
                if row["error"] is None:
                    row["runs"].append(_pass(row["method"], index_path, state_path, Path(mnt), timeout_s))
        for row in rows:
            runs = row.pop("runs")
            bad = next((r for r in runs if r["status"] != "ok"), None)
            if row["error"] is not None:
                row["status"] = "skipped"
            elif bad is not None:
                row |= {"status": bad["status"], "error": bad.get("error", "timeout")}
            else:
                row |= {"status": "ok", **_summary(runs)}
            print(f"  {row['status']:7} {sum(r.get('wall_s', 0) for r in runs):6.1f} s  {row['name']}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return rows


def _unavailable(method: str) -> str | None:
    """Why `method` cannot run here (no torch, no FUSE), or None."""
    import importlib.util

    if method.startswith(("loader", "batches")) and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if method.startswith("fuse"):
        from tenplex.runtime.fuse.dataset import fuse_unavailable_reason

        return fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mounting FUSE needs root")
    return None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    mbps = [r["bytes"] / r["seconds"] / 1e6 for r in runs]
    best = max(range(len(runs)), key=lambda k: mbps[k])
    r = runs[best]
    return {"samples": r["samples"], "bytes": r["bytes"], "best_mbps": mbps[best], "median_mbps": statistics.median(mbps),
            "best_samples_per_s": r["samples"] / r["seconds"], "startup_s": max(x["startup_s"] for x in runs),
            "digests": sorted({x["digest"] for x in runs}), "mbps": mbps, "seconds": [x["seconds"] for x in runs],
            "rtt_us": [x["rtt_us"] for x in runs if "rtt_us" in x]}  # fmt: skip


def check_rows(rows: list[dict[str, Any]]) -> None:
    """Ratios vs direct per sample size; a path whose bytes differ from direct's is an error."""
    direct = {r["sample_bytes"]: r for r in rows if r["method"] == "direct" and r["status"] == "ok"}
    for r in rows:
        ref = direct.get(r["sample_bytes"])
        if r["status"] != "ok" or ref is None:
            continue
        if r["method"] == "bound":
            from bench.dataset_limits import add_round_trips

            add_round_trips(r, ref)
        r["ratios"] = [a / b for a, b in zip(r["mbps"], ref["mbps"])]  # per round
        r["ratio"] = statistics.median(r["ratios"])
        r["goal"] = (
            "—"
            if r["method"] in ANCHORS or r["sample_bytes"] < 64 * KIB
            else ("met" if r["ratio"] >= GOAL else "MISSED")
        )
        if r["digests"] != ref["digests"]:
            r |= {
                "status": "error",
                "error": f"(id, bytes) digest {r['digests']} differs from direct's {ref['digests']}",
            }


def row_cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    head = [fmt_bytes(r["sample_bytes"]), r["path"]]
    if r["status"] != "ok":
        return head + [r["status"].upper()] + [""] * (len(HEADERS) - 4) + [r.get("error", "")[:60]]
    q = r.get("ratios") or [0.0]
    return head + [str(r["samples"]), fmt_bytes(r["bytes"]), f"{r['best_samples_per_s']:,.0f}", f"{r['best_mbps']:,.0f}",
                   f"{r['median_mbps']:,.0f}", f"{min(q):.2f} / {statistics.median(q):.2f} / {max(q):.2f}",
                   f"{r['startup_s']:.2f}", r.get("goal", "")]  # fmt: skip


def markdown(info: dict[str, Any], cells: list[list[str]], rescale_md: str, load_line: str = "") -> str:
    from bench.report import md_table

    return "\n".join([
        "# Dataset benchmark (`python -m bench --only dataset`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        "## Reading one rank's samples", "",
        f"Rank {RANK} of W = {WORLD}, global batch {GLOBAL_BATCH}, one epoch of a raw dataset on tmpfs; every pass "
        "in a fresh child process, in rounds that run every path once right after direct; a path's ratio is its "
        "MB/s over direct's of the same round, min / median / max over the rounds (the goal is judged on the "
        f"median). Goal: FUSE (a file per sample or per step, or ranges + sources) and the DataLoader (RankBatches, 2 workers) ≥ {GOAL}× direct "
        "for samples ≥ 64 KiB. "
        "See the docstring of bench/dataset.py for the paths.", "",
        md_table(HEADERS, cells), "", load_line, "",
        NOTES, "",
        rescale_md,
    ])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench import dataset_rescale
    from bench.dataset_limits import rtt_line
    from bench.report import text_table, write_results

    print("dataset reads (one child process per pass):", file=sys.stderr)
    rows = [
        r
        for s, t in (QUICK_SIZES if quick else SIZES)
        for r in measure_size(s, t, QUICK_PASSES if quick else PASSES, timeout_s)
    ]
    check_rows(rows)
    cells = [row_cells(r) for r in rows]
    load = os.getloadavg()
    tail = f"{rtt_line(rows)}; load average {load[0]:.1f} / {load[1]:.1f} (1 / 5 min) at the end"
    print(
        f"\nReading rank {RANK} of {WORLD}: direct vs DataLoader vs FUSE (goal: FUSE >= {GOAL}x direct, samples >= 64 KiB)"
    )
    print(text_table(HEADERS, cells) + f"\n{tail}\n", flush=True)
    rescale = dataset_rescale.run(quick)
    print(dataset_rescale.text(rescale) + "\n", flush=True)
    doc, md = (
        {"machine": info, "reads": rows, "rescale": rescale},
        markdown(info, cells, dataset_rescale.markdown(rescale), tail),
    )
    return rows + rescale["rows"], write_results(out_dir, "dataset-quick" if quick else "dataset", doc, md)
