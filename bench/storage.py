"""`python -m bench.storage [--repeats R] [--rate 1gbit]`: one reconfiguration through tenplex stores
vs through a storage host, on emulated hosts (needs root and iproute2).

4 emulated hosts, links shaped to `--rate`: h0, h1, h2 compute, h3 storage. A GPT-sized state
(12.8 M parameters and two Adam moments, 154 MB of fp32) is saved by 2 ranks as tp shards (on
h0, h1) and loaded by 3 ranks as dp replicas (on h0, h1, h2): every new rank needs every byte.

- tenplex: the ranks `dcp.save` into their hosts' stores (`StoreWriter`), the agents move the
  state with a verified plan (`reshard_stored`: plan, then move), the new ranks `dcp.load` from
  their hosts' stores (`StoreReader`);
- storage, the path users have today: the ranks `dcp.save` to files and put them on the storage
  host over their links (HTTP), the new ranks get them back over theirs and `dcp.load` them with
  DCP's own load-time resharding.

Each path runs R times, alternating. Printed: each phase (min / median / max seconds), the total
and its ratio, and the bytes on every link against the plan's network lower bound. Every rank
checks what it loaded against the saved state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tenplex.frameworks.dcp.reshard import reshard_stored  # noqa: E402
from tenplex.runtime.agent.fleet import AgentFleet  # noqa: E402
from tenplex.runtime.netns import EmulatedHosts  # noqa: E402
from tenplex.runtime.runtime import Runtime  # noqa: E402

RANK = ROOT / "bench" / "storage_rank.py"
DP3 = {"format": "tenplex.dtensor-layout/1", "mesh": [3], "placements": {"*": ["R"]}}
SERVER = r"""
import http.server, json, os, sys
root = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        path = os.path.join(root, self.path.lstrip("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_GET(self):
        path = os.path.join(root, self.path.lstrip("/"))
        body = json.dumps(sorted(os.listdir(path))).encode() if os.path.isdir(path) else open(path, "rb").read()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[2])), H).serve_forever()
"""


def torchrun(hosts: EmulatedHosts, nodes: list[int], args: list[str], tmp: Path, run: int,
             per_node: dict[int, list[str]]) -> list[dict]:  # fmt: skip
    """Run `storage_rank.py ARGS` with one rank on each of `nodes`; the ranks' reports."""
    procs, outs = [], []
    for k, i in enumerate(nodes):
        out = tmp / f"out-{run}-{k}.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)), "--node-rank", str(k),
                "--nproc-per-node", "1", "--master-addr", hosts.hosts[nodes[0]].address, "--master-port", str(29700 + run),
                str(RANK), *args, "--out", str(out), *per_node[i]]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": hosts.hosts[i].iface, "OMP_NUM_THREADS": "1"}
        log = open(tmp / f"log-{run}-{k}.txt", "w")  # noqa: SIM115
        procs.append(hosts.run(i, argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        outs.append(out)
    for p in procs:
        if p.wait(600) != 0:
            raise SystemExit(f"a rank failed; see {tmp}/log-{run}-*.txt")
    return [json.loads(o.read_text()) for o in outs]


def one_pair(hosts: EmulatedHosts, fleet: AgentFleet, rt: Runtime, url: str, tmp: Path, i: int) -> dict:
    """One reconfiguration each way: {"store": {phase: s}, "storage": {...}, links...}."""
    stores = {n: ["--store", fleet.stores[f"h{n}"]] for n in range(3)}
    for tag in ("saved", "state"):
        rt.drop("bench", tag)
    saved = torchrun(hosts, [0, 1], ["save", "store"], tmp, 4 * i, stores)
    moved = reshard_stored(rt, "bench", "saved", "state", DP3, hosts={0: "h0", 1: "h1", 2: "h2"})
    loaded = torchrun(hosts, [0, 1, 2], ["load", "store"], tmp, 4 * i + 1, stores)
    links = Counter()
    for m in moved.plan.messages:
        if m.src_host != m.dst_host:
            links[f"{m.src_host}->{m.dst_host}"] += m.bytes
    store = {"save": max(r["seconds"]["save"] for r in saved), **moved.seconds,
             "load": max(r["seconds"]["load"] for r in loaded)}  # fmt: skip
    files = {n: ["--url", f"{url}/run{i}", "--dir", str(tmp / f"h{n}-run{i}")] for n in range(3)}
    saved = torchrun(hosts, [0, 1], ["save", "storage"], tmp, 4 * i + 2, files)
    loaded = torchrun(hosts, [0, 1, 2], ["load", "storage"], tmp, 4 * i + 3, files)
    storage_links = Counter()
    for n, r in enumerate(saved):
        storage_links[f"h{n}->h3"] += sum(r["bytes"].values())
    for n, r in enumerate(loaded):
        storage_links[f"h3->h{n}"] += sum(r["bytes"].values())
    storage = {"save": max(r["seconds"]["save"] for r in saved), "load": max(r["seconds"]["load"] for r in loaded)}
    return {"store": store, "storage": storage, "links": dict(links), "bound": moved.plan.stats.network_lower_bound_bytes,
            "storage_links": dict(storage_links)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rate", default="1gbit")
    args = p.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tenplex-bench-storage-") as tmp_name, \
            EmulatedHosts(4, rate=args.rate) as hosts, AgentFleet(["h0", "h1", "h2"], hosts=hosts, local=True) as fleet, \
            Runtime.connect(fleet.controls) as rt:  # fmt: skip
        tmp = Path(tmp_name)
        (tmp / "storage").mkdir()
        server = hosts.run(3, [sys.executable, "-c", SERVER, str(tmp / "storage"), "8000"])
        try:
            url = f"http://{hosts.hosts[3].address}:8000"
            for i in range(args.repeats):
                print(f"run {i + 1}/{args.repeats}", file=sys.stderr, flush=True)
                runs.append(one_pair(hosts, fleet, rt, url, tmp, i))
        finally:
            server.kill()
            server.wait()
    stat = lambda xs: f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"  # noqa: E731
    for path in ("store", "storage"):
        phases = list(runs[0][path])
        cells = "; ".join(f"{k} {stat([r[path][k] for r in runs])}" for k in phases)
        print(f"{path:8} {cells}; total {stat([sum(r[path].values()) for r in runs])} s (min / median / max)")
    ratio = statistics.median(sum(r["store"].values()) for r in runs) / statistics.median(sum(r["storage"].values()) for r in runs)
    print(f"tenplex / storage (median totals): {ratio:.2f}x")
    mb = lambda d: ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(d.items()))  # noqa: E731
    print(f"tenplex links: {mb(runs[0]['links'])}; total {sum(runs[0]['links'].values()) / 1e6:.1f} MB "
          f"= network lower bound {runs[0]['bound'] / 1e6:.1f} MB")  # fmt: skip
    print(f"storage links: {mb(runs[0]['storage_links'])}; total {sum(runs[0]['storage_links'].values()) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
