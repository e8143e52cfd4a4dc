"""`python -m bench --only hosts`: peer-to-peer vs centralized resharding on emulated hosts.

4 emulated hosts (network namespaces behind a bridge, every link shaped to 1 Gbit/s with tbf),
one `tenplex agent` per host (UCX over TCP between them), 2 devices per host, a GPT-style model
with bf16 weights and fp32 Adam state. Per case, in one fresh process: the peer-to-peer plan
(`Runtime.execute`) and the centralized baseline (`compile_central` + `Runtime.execute_central`:
gather on h0, scatter from it, the paper's Tenplex-Central) run on the same agents from the same
src state, each compiled and sliced per host (`Runtime.stage`) before its clock starts; both dst
states are fetched and checked byte for byte against the source oracle. Reported: seconds of
each, central / P2P (goal ≥ 2.5×), and P2P / the plan's bandwidth bound (goal ≤ 1.3×). The bound is `Stats.lower_bound_seconds` with the link rate as network bandwidth:
the busiest host's ingress, or all bytes over all NICs. tbf counts every frame's headers against
the rate, so TCP payload can reach at most 1448/1514 of it at the default MTU of 1500 (P2P/bound
≥ 1.046 whatever the execution does) and 8948/9014 with jumbo frames: `BENCH_HOSTS_MTU=9000`
runs the links at MTU 9000 (the table says which). Needs root and iproute2; skipped with the
reason otherwise. Results: bench/results/hosts.{md,json} (hosts-quick.* with --quick).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HOSTS = 4
RATE, RATE_BYTES = "1gbit", 125e6  # tbf rate and the same in bytes/s (as demo.hosts)
MTU = int(os.environ.get("BENCH_HOSTS_MTU", "1500"))  # of every link (1500: the kernel's default)
GOAL_SPEEDUP, GOAL_BOUND = 2.5, 1.3
MODEL = "gpt-tiny:layers=4,hidden=768,heads=12,ffn=3072,vocab=8192"
QUICK_MODEL = "gpt-tiny:layers=4,hidden=256,heads=8,ffn=1024,vocab=4096"
MOVES = (  # the paper's DP/PP/TP changes, scaling 4 <-> 8 devices on 2 <-> 4 hosts, and a redeployment
    ("DP 1->2 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp2,pp2,dp2@4x2"),
    ("PP 2->4 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp2,pp4,dp1@4x2"),
    ("TP 2->4 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp4,pp2,dp1@4x2"),
    ("PP 4->2 (8->4 GPUs)", "tp2,pp4,dp1@4x2", "tp2,pp2,dp1@2x2"),
    ("redeploy to 2 other hosts", "tp2,pp2,dp1@2x2", "tp2,pp2,dp1@2x2+2"),
)
HEADERS = ["case", "status", "state", "P2P network", "central network", "bound s", "P2P s", "central s",
           "central/P2P", "P2P/bound", "RSS growth/dst", "checked"]  # fmt: skip


def cases(quick: bool) -> list[tuple[str, str, str, str]]:
    model = QUICK_MODEL if quick else MODEL
    return [(name, model, a, b) for name, a, b in (MOVES[:1] if quick else MOVES)]


# ---- one case, in a fresh process ------------------------------------------------------
def measure(model: str, src: str, dst: str) -> dict[str, Any]:
    from demo.hosts import run_hosts

    rows, reason = run_hosts(model, [("case", src, dst)], RATE, RATE_BYTES, None if MTU == 1500 else MTU)
    if reason:
        return {"skipped": reason}
    row = rows[0]
    if "error" in row:
        raise SystemExit(row["error"])
    kept = {k: v for k, v in row.items() if k not in ("name", "src", "dst")}
    return {"hosts": HOSTS, "rate": RATE, "mtu": MTU, **kept}


# ---- the driver --------------------------------------------------------------------------
def row_cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    if r["status"] != "ok" or "skipped" in r:
        why = r.get("skipped") or r.get("error", "")
        return [r["name"], "skipped" if "skipped" in r else r["status"], *[""] * (len(HEADERS) - 3), why[:80]]
    return [r["name"], "ok", fmt_bytes(r["state_bytes"]), fmt_bytes(r["p2p_network_bytes"]),
            fmt_bytes(r["central_network_bytes"]), f"{r['bound_s']:.2f}", f"{r['p2p_s']:.2f}", f"{r['central_s']:.2f}",
            f"{r['speedup']:.2f}x", f"{r['p2p_over_bound']:.2f}x", f"{r['rss_ratio']:.2f}x",
            fmt_bytes(r["checked_bytes"])]  # fmt: skip


def markdown(info: dict[str, Any], rows: list[dict]) -> str:
    from bench.report import md_table

    return "\n".join([
        "# Emulated hosts: peer-to-peer vs centralized (`python -m bench --only hosts`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        f"{HOSTS} emulated hosts (network namespaces, bridge, tbf {RATE} and MTU {MTU} on every link), one `tenplex agent` each, "
        "UCX over TCP between them, 2 devices per host. P2P: the compiled plan. Central: gather everything on h0, "
        "scatter from it (the paper's Tenplex-Central). Seconds of `Runtime.execute` (prepare, rounds, commit; "
        "both plans compiled and sliced per host, `Runtime.stage`, before the clock). "
        f"Goals: central/P2P ≥ {GOAL_SPEEDUP}×, P2P/bound ≤ {GOAL_BOUND}×. 'checked': dst bytes of both runs "
        "compared with the source oracle. RSS growth/dst: the largest, over hosts, of the agent's peak "
        "resident bytes during the P2P execution minus its resident bytes before, over the dst bytes "
        "that host ends with (goal ≤ 1.25 + the message budget).", "",
        md_table(HEADERS, [row_cells(r) for r in rows]), "",
        "\n".join(f"- {r['name']}: `{r['src']}` → `{r['dst']}`" for r in rows), "",
    ])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import text_table, write_results
    from bench.runner import progress, run_json

    rows = []
    for name, model, src, dst in cases(quick):
        row = {"name": name, "src": f"{model},{src}", "dst": f"{model},{dst}"}
        rows.append(run_json(["bench.hosts", model, src, dst], row, timeout_s))
        progress(rows[-1], name)
    print(f"\nEmulated hosts ({HOSTS} x {RATE}, MTU {MTU}): P2P vs central (goals >= {GOAL_SPEEDUP}x, <= {GOAL_BOUND}x bound)")  # fmt: skip
    print(text_table(HEADERS, [row_cells(r) for r in rows]) + "\n", flush=True)
    stem = "hosts-quick" if quick else "hosts"
    return rows, write_results(out_dir, stem, {"machine": info, "hosts": rows}, markdown(info, rows))


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:4])))
