"""`reshard_deepspeed`: a DeepSpeed ZeRO-1/2 or universal checkpoint -> a ZeRO-1/2 checkpoint with
another DP world size, and `deepspeed_findings`: what a DeepSpeed checkpoint holds, in words.

`to` is `dp=N` (optionally `,tp=1,pp=1`: tenplex reads and writes one model-parallel rank, so
any other tp or pp is refused). The plan is tenplex's verified one (`dcp.reshard.reshard_arrays`
on the PTCs of `deepspeed.meta`): with one worker its ops are applied in-process straight into
the writer's flat partitions (`dcp.apply`: one copy per byte, no second copy of the state held);
with more, on local agents, whose arrays the writer then copies into place.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
import numpy as np

from tenplex.compiler.emit import human_bytes
from tenplex.frameworks.dcp.apply import StreamedArrays, apply_ops
from tenplex.frameworks.dcp.reshard import reshard_arrays
from tenplex.frameworks.deepspeed.files import DeepSpeedError
from tenplex.frameworks.deepspeed.meta import DeepSpeedMeta, build_ptc
from tenplex.frameworks.deepspeed.read import read_deepspeed
from tenplex.frameworks.deepspeed.write import Fill, write_deepspeed
from tenplex.ir.ptc import PTC


@attrs.frozen
class DeepSpeedReshardResult:
    out_dir: str
    src_dp: int
    dp: int
    workers: int
    bytes_moved: int  # bytes the plan copies between ranks
    seconds: dict[str, float]  # read, reshard (compile; with agents also execute), write (with one worker also execute)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        return (f"tenplex: resharded DeepSpeed ZeRO DP {self.src_dp} -> {self.dp} into {self.out_dir} with {self.workers} "
                f"worker(s): {human_bytes(self.bytes_moved)} moved between ranks, plan verified ({parts})")  # fmt: skip


def parse_dp(to: str) -> int:
    """N of `dp=N[,tp=1][,pp=1]`. Raises DeepSpeedError naming the bad part."""
    fields: dict[str, int] = {}
    for part in to.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key not in ("dp", "tp", "pp") or not value.isdigit() or int(value) < 1 or key in fields:
            raise DeepSpeedError(f"--to {to!r}: expected dp=N[,tp=1][,pp=1] (each once, N >= 1), got {part.strip()!r}")
        fields[key] = int(value)
    if "dp" not in fields:
        raise DeepSpeedError(f"--to {to!r}: dp=N missing")
    if fields.get("tp", 1) != 1 or fields.get("pp", 1) != 1:
        raise DeepSpeedError(f"--to {to!r}: tenplex writes DeepSpeed checkpoints with tp=1 and pp=1 only (the source's; "
                             "DeepSpeed does not record how a model splits its tensors over TP)")  # fmt: skip
    return fields["dp"]


def dst_ptc(meta: DeepSpeedMeta, to: str) -> PTC:
    return build_ptc(meta, parse_dp(to))


def reshard_deepspeed(src_dir: str | os.PathLike, to: str, out_dir: str | os.PathLike, workers: int = 1, *,
                      trust_pickles: bool = False) -> DeepSpeedReshardResult:  # fmt: skip
    """Reshard the checkpoint at `src_dir` to `to` (`dp=N`) into `out_dir` (see the module docstring).
    Raises DeepSpeedError (bad SRC or `to`, existing OUT) and the compiler's and runtime's errors."""
    dp = parse_dp(to)
    if Path(out_dir).exists():
        raise DeepSpeedError(f"{out_dir}: already exists (refusing to overwrite)")
    clock = [time.perf_counter()]
    src, arrays, values, meta = read_deepspeed(src_dir, trust_pickles=trust_pickles)
    clock.append(time.perf_counter())
    dst = build_ptc(meta, dp)
    out_arrays, _, plan = reshard_arrays(src, arrays, values, dst, workers, stream=workers == 1)
    clock.append(time.perf_counter())
    write_deepspeed(dst, _fill(out_arrays) if isinstance(out_arrays, StreamedArrays) else out_arrays, meta, dp, out_dir)
    clock.append(time.perf_counter())
    seconds = dict(zip(("read", "reshard", "write"), (b - a for a, b in zip(clock, clock[1:]))))
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    return DeepSpeedReshardResult(str(out_dir), meta.dp, dp, workers, moved, seconds)


def deepspeed_findings(path: str | os.PathLike, meta: DeepSpeedMeta, ptc: PTC) -> list[str]:
    """Plain-words lines about a read DeepSpeed checkpoint."""
    what = "universal checkpoint (ds_to_universal output)" if meta.kind == "universal" else f"ZeRO stage {meta.stage} checkpoint"
    params = sum(len(g) for g in meta.groups)
    numel = sum(g.numel for g in meta.flat_groups(1))
    version = meta.top.get("ds_version", "?")
    lines = [f"DeepSpeed {what} {path}: tag {meta.tag!r}, DeepSpeed {version}, one model-parallel rank"]
    if meta.kind == "universal":
        lines.append(f"  whole tensors per parameter (zero/<param>/<state>.pt); saved from DP {meta.model_states.get('dp_world_size', '?')}")
    else:
        sizes = ", ".join(str(g.partition_size) for g in meta.flat_groups(meta.dp))
        lines.append(f"  DP {meta.dp}: each rank holds 1/{meta.dp} of every param group's flat fp32 master and optimizer "
                     f"state (partition sizes {sizes} elements; padding to a multiple of {2 * meta.dp})")  # fmt: skip
    lines.append(f"  {len(meta.groups)} param group(s), {params} parameters, {numel} elements; optimizer state: "
                 f"fp32 master + {', '.join(meta.states) or 'none'}; steps {[_number(s.get('step')) for s in meta.scalars]}")  # fmt: skip
    dtypes = sorted({d for _, d, _ in meta.module})
    lines.append(f"  model file: {len(meta.module)} module tensors ({', '.join(dtypes)}), global_steps "
                 f"{meta.model_states.get('global_steps')}; {human_bytes(sum(t.nbytes for t in ptc.tensors))} in all")  # fmt: skip
    lines.append(f"  reshard it with: tenplex reshard {path} --from deepspeed --to dp=N --out OUT")
    return lines


def _fill(streamed: StreamedArrays) -> Fill:
    """The plan's ops of each dst sub-tensor applied straight into the writer's buffer."""

    def fill(sid: str, target: np.ndarray) -> None:
        apply_ops(streamed.ops.get(sid, []), streamed.src, streamed.dst, streamed.src_arrays, target)

    return fill


def _number(v: object) -> object:
    return v.item() if hasattr(v, "item") else v
