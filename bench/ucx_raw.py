"""Raw ucxx send/recv vs tenplex `UcxPeer` vs a numpy copy, between two processes on one host.

`python -m bench.ucx_raw [--sizes-mib 64 256] [--iters 3]`: a spawned child sends `iters + 1`
messages of each size (the first is a warm-up) through (a) the raw ucxx core API (shared memory:
worker-address endpoint, no error handling, blocking progress) and (b) `UcxPeer`; the parent
receives into one preallocated buffer and reports GB/s, and GB/s of `np.copyto` of the same
bytes into a preallocated buffer, with the ratios. One run; two-process figures vary ±30-50%
between runs, so compare the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

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
    for n in sizes:
        buf = array(np.ones(n, dtype=np.uint8))
        for _ in range(iters + 1):
            _raw_wait(worker, ep.tag_send(buf, api.UCXXTag(1)))
    conn.recv()  # receiver done: now the UcxPeer round
    peer = UcxPeer("bench-child", timeout=TIMEOUT)
    conn.send(peer.address)
    tep = peer.connect(conn.recv())
    for n in sizes:
        buf = np.ones(n, dtype=np.uint8)
        for _ in range(iters + 1):
            peer.send(tep, buf, tag=1)
    peer.close(tep)


def _timed(fn, iters: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ucx_raw", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256])
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    sizes = [m << 20 for m in args.sizes_mib]
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child_conn, sizes, args.iters), daemon=True)
    proc.start()
    try:
        api, array, _ctx, worker = _raw_peer()
        child_addr = conn.recv()
        conn.send(bytes(worker.address.tobytes()))
        api.UCXEndpoint.create_from_worker_address(
            worker, api.UCXAddress.create_from_buffer(np.frombuffer(child_addr, dtype=np.uint8)), False)
        raw, ours, copy = {}, {}, {}
        for n in sizes:
            out = array(np.zeros(n, dtype=np.uint8))
            raw[n] = _timed(lambda out=out: _raw_wait(worker, worker.tag_recv(out, api.UCXXTag(1))), args.iters)
        conn.send("next")
        with UcxPeer("bench-parent", timeout=TIMEOUT) as peer:
            child_address = conn.recv()
            conn.send(peer.address)
            tep = peer.connect(child_address)
            for n in sizes:
                out = np.zeros(n, dtype=np.uint8)
                ours[n] = _timed(lambda out=out: peer.recv(tep, out, tag=1), args.iters)
            peer.close(tep)
        for n in sizes:
            src, dst = np.ones(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
            copy[n] = _timed(lambda src=src, dst=dst: np.copyto(dst, src), args.iters)
        print(f"{'MiB':>6} {'raw ucxx GB/s':>14} {'UcxPeer GB/s':>13} {'numpy copy GB/s':>16} {'raw/copy':>9} {'peer/raw':>9}")
        for n in sizes:
            g = [n / t / 1e9 for t in (raw[n], ours[n], copy[n])]
            print(f"{n >> 20:>6} {g[0]:>14.2f} {g[1]:>13.2f} {g[2]:>16.2f} {g[0] / g[2]:>9.2f} {g[1] / g[0]:>9.2f}")
        proc.join(TIMEOUT)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


if __name__ == "__main__":
    main()
