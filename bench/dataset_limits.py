"""Anchors of `python -m bench --only dataset` that isolate a limit of the machine, not of tenplex.

- `round_trip_s()`: one round trip between two processes (a byte each way over two pipes), the
  least that any user-space file server costs a reader per request: the reader blocks in the
  kernel, the server wakes, answers, the reader wakes. A FUSE sample file costs two requests on
  the reader's path (OPEN and READ; RELEASE is not waited for), so a FUSE server answering in
  zero time could reach at best direct / (direct + 2 round trips) per file: the bench's
  "bound" row.
- `ring_pass(...)`: the rank's samples read in one process by `os.preadv` into a 64 MiB ring,
  where every byte lands in memory that is no longer in the CPU cache (as in `RankBatches`'
  shared slots, where a batch must stay until it is used), against the direct anchor's
  `os.pread`, whose fresh 1 MiB buffer glibc hands back warm from the cache every time; with
  two processes at once ("ring2"), each every other 4 MiB: what two readers get from the two
  cores (and the memory bus) that this machine gives them in that round, the ceiling of
  `RankBatches` with two workers (which also needs the training process on the same cores).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import statistics
import time
from typing import Any

RING_BYTES = 64 << 20


def round_trip_s(trips: int = 4000) -> float:
    """Mean seconds of one round trip between this process and a forked child (see module doc)."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo server
        try:
            for _ in range(trips + 1):
                os.write(from_child, os.read(to_child, 1))
        finally:
            os._exit(0)
    try:
        os.write(from_parent, b"x")  # warm up: the child is scheduled once
        os.read(to_parent, 1)
        t0 = time.perf_counter()
        for _ in range(trips):
            os.write(from_parent, b"x")
            os.read(to_parent, 1)
        return (time.perf_counter() - t0) / trips
    finally:
        os.waitpid(pid, 0)
        for fd in (to_child, from_parent, to_parent, from_child):
            os.close(fd)


def ring_pass(fds: list[int], ids: list[int], ranges: tuple[list[int], list[int], list[int]],
              procs: int = 1) -> dict[str, Any]:  # fmt: skip
    """Read samples `ids` (their (file, offset, length) `ranges`) into a ring of `RING_BYTES`,
    timed (with `procs` = 2: this process and a forked one at once, each every other 4 MiB of
    samples into a ring of its own, as `RankBatches`' two workers); then again in this process
    for the sha256 of the (id, bytes) sequence."""
    rows = list(zip(ids, *ranges))
    chunk = [at // (4 << 20) % procs for at in itertools.accumulate([0, *ranges[2][:-1]])]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork() if procs == 2 else -1
    ring = _ring()  # after the fork: each process its own, faulted in (no copy-on-write in the pass)
    if pid == 0:  # the second reader: every odd chunk
        os.write(ready_w, b"x")
        os.read(go_r, 1)
        _fill(ring, fds, [r for r, c in zip(rows, chunk) if c == 1], None)
        os._exit(0)
    if pid > 0:
        os.read(ready_r, 1)
    t0 = time.perf_counter()
    os.write(go_w, b"x")
    size = _fill(ring, fds, [r for r, c in zip(rows, chunk) if c == 0], None)
    if pid > 0:
        os.waitpid(pid, 0)
        size += sum(r[3] for r, c in zip(rows, chunk) if c == 1)
    seconds = time.perf_counter() - t0
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)
    sha = hashlib.sha256()
    _fill(ring, fds, rows, sha)
    return {"seconds": seconds, "startup_s": 0.0, "samples": len(ids), "bytes": size, "digest": sha.hexdigest()}


def _ring() -> memoryview:
    """`RING_BYTES` of memory, every page faulted in (as `RankBatches`' slots after its first pass)."""
    ring = memoryview(bytearray(RING_BYTES))
    for k in range(0, RING_BYTES, 4096):
        ring[k] = 0
    return ring


def _fill(ring: memoryview, fds: list[int], rows: list[tuple[int, int, int, int]], digest: Any) -> int:
    """Read the rows' (id, file, offset, length) samples one after another into `ring`, wrapping."""
    at = total = 0
    for i, f, o, n in rows:
        at = 0 if at + n > len(ring) else at
        total += os.preadv(fds[f], [ring[at : at + n]], o)
        if digest is not None:
            digest.update(i.to_bytes(8, "little") + ring[at : at + n])
        at += n
    return total


def anchor_pass(method: str, index: Any, files: Any) -> dict[str, Any]:
    """`bench.dataset.read_pass` for the anchors: "ring" reads the samples into the ring; "bound"
    measures a round trip and reports 2 per sample as its seconds (`add_round_trips`)."""
    ids = files.view.ids_between(files.view.start, files.stop).tolist()
    ranges = tuple(a.tolist() for a in index.ranges(ids))
    if method.startswith("ring"):
        fds = [os.open(index.location(k), os.O_RDONLY) for k in range(len(index.files))]
        return ring_pass(fds, ids, ranges, 2 if method == "ring2" else 1)
    rtt = round_trip_s()
    return {"seconds": 2 * rtt * len(ids), "startup_s": 0.0, "samples": len(ids), "bytes": sum(ranges[2]),
            "digest": "-", "rtt_us": rtt * 1e6}  # fmt: skip


def add_round_trips(row: dict[str, Any], direct: dict[str, Any]) -> None:
    """The "bound" row's MB/s, round by round: direct's bytes over direct's seconds plus the
    row's (two round trips per file, measured in the same round)."""
    row["mbps"] = [direct["bytes"] / (d + t) / 1e6 for d, t in zip(direct["seconds"], row["seconds"])]
    row |= {"best_mbps": max(row["mbps"]), "median_mbps": statistics.median(row["mbps"]), "digests": direct["digests"]}
    row["best_samples_per_s"] = row["best_mbps"] * 1e6 / row["sample_bytes"]


def rtt_line(rows: list[dict[str, Any]]) -> str:
    """The round trips that the bound rows measured: min / median / max µs."""
    rtt = sorted(x for r in rows for x in r.get("rtt_us", []))
    if not rtt:
        return "no round trip measured"
    return f"Process round trip (the bound rows): {rtt[0]:.1f} / {statistics.median(rtt):.1f} / {rtt[-1]:.1f} µs"
