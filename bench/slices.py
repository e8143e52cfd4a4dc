"""`python -m bench --only slices`: what each agent parses before an execute, at 1024 GPUs.

Per case (the compile table's GPT-3 175B 1024 → 768 GPUs; --quick: 32 → 16 GPUs), in a fresh
process: the runtime's one pass slicing the plan for every host (`host_slices`, CPU s), then per
host the agent's prepare of its own slice: decoding the control frame (`agent.wire`) and the
slice (`rounds.Execution`); reported is the slowest host (CPU s, goal ≤ 0.5 s) and its frame
bytes. Anchor, in the same process: what every agent parsed before slices, the whole plan and
both PTCs as JSON in one frame (wire decode, `plan_from_json`, `ptc_from_json` × 2). Ratio =
anchor CPU s / slowest slice CPU s. CPU seconds (`time.process_time`), not wall time.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.cases import compile_cases

GOAL_S = 0.5


def _cpu(fn: Any) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def measure(src_spec: str, dst_spec: str) -> dict[str, Any]:
    from tenplex.compiler import compile_plan
    from tenplex.compiler.emit.slices import host_slices
    from tenplex.compiler.plan import plan_from_json, plan_to_json
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.ir.serialize import ptc_from_json, ptc_to_json
    from tenplex.runtime.agent.rounds import Execution
    from tenplex.runtime.agent.wire import decode, encode

    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    plan = compile_plan(src, dst)
    hosts = sorted(set(src.topology.hosts) | set(dst.topology.hosts))
    slices, slice_s = _cpu(lambda: host_slices(plan, src, dst, hosts))
    gc.collect()
    gc.freeze()  # an agent's heap holds no plan: keep this process's from being scanned on its clock
    worst, worst_bytes, regions = 0.0, 0, 0
    for h in hosts:
        header, buffers = encode({"slice": slices[h]})
        frame = bytes(header), [memoryview(bytes(b)) for b in buffers]
        ex, cpu = _cpu(lambda frame=frame, h=h: Execution(h, "j", "a", "b", decode(*frame)["slice"]))
        size = len(frame[0]) + sum(b.nbytes for b in frame[1])
        if cpu > worst:
            worst, worst_bytes, regions = cpu, size, len(ex.regions)
    header, buffers = encode({"plan": plan_to_json(plan), "src": ptc_to_json(src), "dst": ptc_to_json(dst)})
    whole = bytes(header), [memoryview(bytes(b)) for b in buffers]

    def parse_whole() -> None:
        doc = decode(*whole)
        plan_from_json(doc["plan"])
        ptc_from_json(doc["src"])
        ptc_from_json(doc["dst"])

    _, whole_s = _cpu(parse_whole)
    return {"hosts": len(hosts), "ops": len(plan.ops), "messages": len(plan.messages), "slice_all_s": slice_s,
            "agent_s": worst, "agent_bytes": worst_bytes, "agent_regions": regions, "whole_s": whole_s,
            "whole_bytes": len(whole[0]) + sum(b.nbytes for b in whole[1]), "ratio": whole_s / max(worst, 1e-9)}  # fmt: skip


HEADERS = ["case", "status", "hosts", "ops", "slicing, all hosts (runtime) s", "slowest agent prepare s",
           "its frame", "whole plan + PTCs parse s", "whole frame", "whole / slice"]  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import fmt_bytes, md_table, text_table, write_results
    from bench.runner import progress, run_json

    rows = []
    for case in compile_cases(quick)[:1]:
        rows.append(run_json(["bench.slices", case.src, case.dst], {"name": case.name, "src": case.src, "dst": case.dst}, timeout_s))
        progress(rows[-1], case.name)

    def cells(r: dict[str, Any]) -> list[str]:
        if r["status"] != "ok":
            return [r["name"], r["status"], *[""] * (len(HEADERS) - 3), r.get("error", "")[:80]]
        return [r["name"], "ok", str(r["hosts"]), str(r["ops"]), f"{r['slice_all_s']:.2f}", f"{r['agent_s']:.3f}",
                fmt_bytes(r["agent_bytes"]), f"{r['whole_s']:.2f}", fmt_bytes(r["whole_bytes"]), f"{r['ratio']:.0f}x"]  # fmt: skip

    what = (f"CPU seconds an agent spends on its share of the plan before an execute (goal ≤ {GOAL_S} s): its own "
            "slice (wire frame + `Execution`), against parsing the whole plan and both PTCs (the anchor).")
    print(f"\n{what}\n" + text_table(HEADERS, [cells(r) for r in rows]) + "\n", flush=True)
    md = "\n".join(["# `python -m bench --only slices`", "",
                    f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
                    what, "", md_table(HEADERS, [cells(r) for r in rows]), "",
                    "\n".join(f"- {r['name']}: `{r['src']}` → `{r['dst']}`" for r in rows), ""])  # fmt: skip
    return rows, write_results(out_dir, "slices-quick" if quick else "slices", {"machine": info, "slices": rows}, md)


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:3])))
