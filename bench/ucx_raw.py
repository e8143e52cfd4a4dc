"""Raw ucxx send/recv vs tenplex `UcxPeer` vs a numpy copy, between two processes on one host.

`python -m bench.ucx_raw [--sizes-mib 64 256] [--iters 3]`: a spawned child sends `iters + 1`
messages of each size (the first is a warm-up) through (a) the raw ucxx core API (shared memory:
worker-address endpoint, no error handling, blocking progress) and (b) `UcxPeer.exchange` (what
agents use: one headerless tagged message each), one of each per iteration in turns; the parent receives into one preallocated
buffer and reports GB/s, and GB/s of `np.copyto` of the same bytes into a preallocated buffer,
with the ratios. Two-process figures vary ±30-50% between runs, so compare the ratios:
`python -m bench --only ucx` repeats the pair in fresh processes and reports
UcxPeer / raw min/median/max (goal ≥ 0.95×).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from typing import Any

import numpy as np

from tenplex.runtime.transport.ucx import UcxPeer, import_ucx

TIMEOUT = 60.0


def _raw_peer():
    api, array = import_ucx()
    ctx = api.UCXContext({}, feature_flags=(api.Feature.TAG, api.Feature.WAKEUP))
    worker = api.UCXWorker(ctx)
    worker.init_blocking_progress_mode()
    return api, array, ctx, worker


def _raw_wait(worker, req) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not req.completed:
        if time.monotonic() > deadline:
            raise TimeoutError("raw ucxx request did not complete")
        worker.progress_worker_event(epoll_timeout=100)
    req.check_error()


def _child(conn, sizes: list[int], iters: int) -> None:
    api, array, _ctx, worker = _raw_peer()
    conn.send(bytes(worker.address.tobytes()))
    addr = api.UCXAddress.create_from_buffer(np.frombuffer(conn.recv(), dtype=np.uint8))
    ep = api.UCXEndpoint.create_from_worker_address(worker, addr, False)
    peer = UcxPeer("bench-child", timeout=TIMEOUT)
    conn.send(peer.address)
    tep = peer.connect(conn.recv())
    for n in sizes:
        raw_buf, buf = array(np.ones(n, dtype=np.uint8)), np.ones(n, dtype=np.uint8)
        sends = (lambda raw_buf=raw_buf: _raw_wait(worker, ep.tag_send(raw_buf, api.UCXXTag(1))),
                 lambda buf=buf: peer.exchange([(tep, buf, 1)], []))
        for i in range(iters + 1):
            for k in _order(i):
                sends[k]()
    peer.close(tep)


def _order(i: int) -> tuple[int, int]:
    """Which goes first in iteration `i`: raw (0) and UcxPeer (1) take turns, so neither always
    follows the other's pages or a burst of load."""
    return (0, 1) if i % 2 == 0 else (1, 0)


def measure(sizes: list[int], iters: int) -> dict[int, tuple[float, float, float]]:
    """{bytes: (raw ucxx s, UcxPeer s, numpy copy s)} per message, one child process.

    Raw and UcxPeer messages are interleaved (one of each per iteration, in turns; the first
    iteration is a warm-up), so the two are measured side by side under the same load."""
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child_conn, sizes, iters), daemon=True)
    proc.start()
    try:
        api, array, _ctx, worker = _raw_peer()
        child_addr = conn.recv()
        conn.send(bytes(worker.address.tobytes()))
        api.UCXEndpoint.create_from_worker_address(
            worker, api.UCXAddress.create_from_buffer(np.frombuffer(child_addr, dtype=np.uint8)), False)
        got = {}
        with UcxPeer("bench-parent", timeout=TIMEOUT) as peer:
            child_address = conn.recv()
            conn.send(peer.address)
            tep = peer.connect(child_address)
            for n in sizes:
                got[n] = _pair(worker, api, array, peer, tep, n, iters)
            peer.close(tep)
        proc.join(TIMEOUT)
        return got
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def _pair(worker, api, array, peer, tep, n: int, iters: int) -> tuple[float, float, float]:
    """Mean seconds of a raw receive, a UcxPeer receive and a numpy copy of `n` bytes."""
    raw_out, out = array(np.zeros(n, dtype=np.uint8)), np.zeros(n, dtype=np.uint8)
    recvs = (lambda: _raw_wait(worker, worker.tag_recv(raw_out, api.UCXXTag(1))),
             lambda: peer.exchange([], [(tep, out, 1)]))
    spent = [0.0, 0.0]
    for i in range(iters + 1):
        for k in _order(i):
            start = time.perf_counter()
            recvs[k]()
            if i:
                spent[k] += time.perf_counter() - start
    if not (out == 1).all():  # every received byte checked
        raise SystemExit(f"UcxPeer received wrong bytes in a {n} B message")
    src, dst = np.ones(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
    np.copyto(dst, src)  # warm-up
    start = time.perf_counter()
    for _ in range(iters):
        np.copyto(dst, src)
    return spent[0] / iters, spent[1] / iters, (time.perf_counter() - start) / iters


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ucx_raw", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256])
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the seconds as one JSON line")
    args = p.parse_args(argv)
    got = measure([m << 20 for m in args.sizes_mib], args.iters)
    if args.json:
        print(json.dumps({"seconds": {str(n): t for n, t in got.items()}}))
        return
    print(f"{'MiB':>6} {'raw ucxx GB/s':>14} {'UcxPeer GB/s':>13} {'numpy copy GB/s':>16} {'raw/copy':>9} {'peer/raw':>9}")
    for n, times in got.items():
        g = [n / t / 1e9 for t in times]
        print(f"{n >> 20:>6} {g[0]:>14.2f} {g[1]:>13.2f} {g[2]:>16.2f} {g[0] / g[2]:>9.2f} {g[1] / g[0]:>9.2f}")


def run(quick: bool, timeout_s: float, out_dir: Any, info: dict[str, Any]) -> tuple[list[dict], list[Any]]:
    """The `ucx` table: UcxPeer / raw ucxx (GB/s ratio) per size, min/median/max over fresh runs."""
    from bench.execute import fmt, spread
    from bench.report import md_table, text_table, write_results
    from bench.runner import progress, run_json

    sizes, repeats = ([16], 3) if quick else ([64, 256], 5)
    runs = []
    for k in range(repeats):
        argv = ["bench.ucx_raw", "--json", "--iters", "5", "--sizes-mib", *map(str, sizes)]
        runs.append(run_json(argv, {"name": f"run {k}"}, timeout_s))
        progress(runs[-1], f"ucx run {k}")
    ok = [r for r in runs if r["status"] == "ok"]
    rows = []
    for m in sizes:
        t = [r["seconds"][str(m << 20)] for r in ok]
        rows.append({"name": f"{m} MiB", "status": "ok" if ok else runs[-1]["status"], "error": runs[-1].get("error", ""),
                     "peer_over_raw": spread([raw / ours for raw, ours, _ in t]) if t else None,
                     "raw_over_copy": spread([copy / raw for raw, _, copy in t]) if t else None})  # fmt: skip
    headers = ["message", "status", "UcxPeer / raw ucxx", "raw ucxx / numpy copy"]
    cells = [[r["name"], r["status"], *([fmt(r["peer_over_raw"]), fmt(r["raw_over_copy"])] if r["peer_over_raw"] else
              ["", r["error"][:80]])] for r in rows]  # fmt: skip
    what = (f"Two processes on one host, UCX shared memory: `UcxPeer.exchange` against the raw ucxx core API, GB/s ratio, "
            f"min / median / max over {repeats} fresh runs (goal ≥ 0.95×); every byte UcxPeer received is checked.")
    print(f"\n{what}\n" + text_table(headers, cells) + "\n", flush=True)
    md = "\n".join(["# `python -m bench --only ucx`", "",
                    f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
                    what, "", md_table(headers, cells), ""])  # fmt: skip
    return rows, write_results(out_dir, "ucx-quick" if quick else "ucx", {"machine": info, "ucx": rows, "runs": runs}, md)


if __name__ == "__main__":
    main()
