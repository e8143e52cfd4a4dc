"""`reshard_deepspeed`: a DeepSpeed ZeRO-1/2 or universal checkpoint -> a ZeRO-1/2 checkpoint with
another DP world size, and `deepspeed_findings`: what a DeepSpeed checkpoint holds, in words.

`to` is `dp=N[,tp=M][,pp=P]`; M and P default to the source's. P other than 1 needs a pipeline
source (`layer_*` files), whose new stages are DeepSpeed's (`stages.parts_for`). M defaults to the source's TP; a
TP change needs the split of every parameter (`tp.splits`, from `universal_checkpoint_info`) and
each split dim divisible by M, else one line says what is missing (`check_tp`). The plan is tenplex's verified one (`dcp.reshard.reshard_arrays`
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
from tenplex.frameworks.deepspeed.files import DeepSpeedError
from tenplex.frameworks.deepspeed.meta import DeepSpeedMeta, build_ptc
from tenplex.frameworks.deepspeed.read import read_deepspeed
from tenplex.frameworks.deepspeed.stages import parts_for
from tenplex.frameworks.deepspeed.tp import INFO
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
    src_tp: int = 1
    tp: int = 1
    src_pp: int = 1
    pp: int = 1

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        tp = f"TP {self.src_tp} -> {self.tp}, " if (self.src_tp, self.tp) != (1, 1) else ""
        tp += f"PP {self.src_pp} -> {self.pp}, " if (self.src_pp, self.pp) != (1, 1) else ""
        return (f"tenplex: resharded DeepSpeed ZeRO {tp}DP {self.src_dp} -> {self.dp} into {self.out_dir} with {self.workers} "
                f"worker(s): {human_bytes(self.bytes_moved)} moved between ranks, plan verified ({parts})")  # fmt: skip


def parse_to(to: str) -> tuple[int, int | None, int | None]:
    """(dp, tp or None, pp or None) of `dp=N[,tp=M][,pp=P]`. Raises DeepSpeedError naming the bad part."""
    fields: dict[str, int] = {}
    for part in to.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key not in ("dp", "tp", "pp") or not value.isdigit() or int(value) < 1 or key in fields:
            raise DeepSpeedError(f"--to {to!r}: expected dp=N[,tp=M][,pp=P] (each once, each >= 1), got {part.strip()!r}")
        fields[key] = int(value)
    if "dp" not in fields:
        raise DeepSpeedError(f"--to {to!r}: dp=N missing")
    return fields["dp"], fields.get("tp"), fields.get("pp")


def parse_dp(to: str) -> int:
    """N of `dp=N[,tp=M][,pp=P]`."""
    return parse_to(to)[0]


def target(meta: DeepSpeedMeta, to: str) -> tuple[int, int, tuple[int, ...]]:
    """(dp, tp, pipeline stage boundaries or ()) that `to` asks of `meta`'s checkpoint; raises
    DeepSpeedError when it cannot be written that way."""
    dp, tp, pp = parse_to(to)
    tp = meta.tp if tp is None else tp
    if not meta.layers and (pp or 1) != 1:
        raise DeepSpeedError(f"--to {to!r}: {meta.tag} is not a pipeline checkpoint (no layer_* files): pp must be 1")
    check_tp(meta, tp)
    return dp, tp, parts_for(meta, pp or meta.pp) if meta.layers else ()


def check_tp(meta: DeepSpeedMeta, tp: int) -> None:
    """Raise DeepSpeedError unless `meta`'s checkpoint can be written with `tp` model-parallel ranks."""
    if tp == meta.tp:
        return
    if meta.why_fixed:
        raise DeepSpeedError(f"{meta.tag}: cannot change TP {meta.tp} -> {tp}: {meta.why_fixed}; a DP-only change "
                             f"(tp={meta.tp}) works")  # fmt: skip
    for n, shape in (x for g in meta.groups for x in g):
        dim = meta.split.get(n)
        if dim is not None and shape[dim] % tp:
            vocab = " (a padded vocabulary: tenplex keeps the padded rows)" if "vocab" in str(meta.model_states.get(INFO)) and dim == 0 else ""
            raise DeepSpeedError(f"{meta.tag}: cannot change TP {meta.tp} -> {tp}: dim {dim} of {n!r} {list(shape)} "
                                 f"does not divide by {tp}{vocab}")  # fmt: skip


def dst_ptc(meta: DeepSpeedMeta, to: str) -> PTC:
    return build_ptc(meta, *target(meta, to))


def reshard_deepspeed(src_dir: str | os.PathLike, to: str, out_dir: str | os.PathLike, workers: int = 1, *,
                      trust_pickles: bool = False) -> DeepSpeedReshardResult:  # fmt: skip
    """Reshard the checkpoint at `src_dir` to `to` (`dp=N[,tp=M][,pp=P]`) into `out_dir` (see the module
    docstring). Raises DeepSpeedError (bad SRC or `to`, existing OUT) and the compiler's and runtime's errors."""
    from tenplex.frameworks.dcp.reshard import reshard_arrays  # imports DCP's reader: not on `inspect`'s path

    parse_to(to)
    if Path(out_dir).exists():
        raise DeepSpeedError(f"{out_dir}: already exists (refusing to overwrite)")
    clock = [time.perf_counter()]
    src, arrays, values, meta = read_deepspeed(src_dir, trust_pickles=trust_pickles)
    dp, tp, parts = target(meta, to)
    clock.append(time.perf_counter())
    dst = build_ptc(meta, dp, tp, parts)
    out_arrays, _, plan = reshard_arrays(src, arrays, values, dst, workers, stream=workers == 1)
    clock.append(time.perf_counter())
    fill = _fill(out_arrays) if isinstance(out_arrays, StreamedArrays) else out_arrays
    write_deepspeed(dst, fill, meta, dp, out_dir, tp, parts)
    clock.append(time.perf_counter())
    seconds = dict(zip(("read", "reshard", "write"), (b - a for a, b in zip(clock, clock[1:]))))
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    return DeepSpeedReshardResult(str(out_dir), meta.dp, dp, workers, moved, seconds, meta.tp, tp, meta.pp, max(1, len(parts) - 1))


def deepspeed_findings(path: str | os.PathLike, meta: DeepSpeedMeta, ptc: PTC) -> list[str]:
    """Plain-words lines about a read DeepSpeed checkpoint."""
    what = "universal checkpoint (ds_to_universal output)" if meta.kind == "universal" else f"ZeRO stage {meta.stage} checkpoint"
    params = sum(len(g) for g in meta.groups)
    numel = sum(g.numel for g in meta.flat_groups(1, 1))
    version = meta.top.get("ds_version", "?")
    mp = "one model-parallel rank" if meta.tp == 1 else f"TP {meta.tp} (mp_rank_00..{meta.tp - 1:02d})"
    if meta.layers:
        mp = f"a pipeline of {meta.pp} stage(s) (mp_rank_00..{meta.pp - 1:02d}, {len(meta.layers)} layer_* files)"
    lines = [f"DeepSpeed {what} {path}: tag {meta.tag!r}, DeepSpeed {version}, {mp}"]
    if meta.kind == "universal":
        lines.append(f"  whole tensors per parameter (zero/<param>/<state>.pt); saved from DP {meta.model_states.get('dp_world_size', '?')}")
    else:
        sizes = ", ".join(str(g.partition_size) for g in meta.flat_groups(meta.dp))
        lines.append(f"  DP {meta.dp}: each rank holds 1/{meta.dp} of every param group's flat fp32 master and optimizer "
                     f"state{' of its TP rank' if meta.tp > 1 else ' of its stage' if meta.layers else ''} "
                     f"({'stage 0: ' if meta.layers else ''}partition sizes {sizes} elements; padding to a multiple of {2 * meta.dp})")  # fmt: skip
    lines.append(f"  {len(meta.groups)} param group(s), {params} parameters, {numel} elements; optimizer state: "
                 f"fp32 master + {', '.join(meta.states) or 'none'}; steps {[_number(s.get('step')) for s in meta.scalars]}")  # fmt: skip
    dtypes = sorted({d for _, d, _ in meta.module})
    lines.append(f"  model file: {len(meta.module)} module tensors ({', '.join(dtypes)}), global_steps "
                 f"{meta.model_states.get('global_steps')}; {human_bytes(sum(t.nbytes for t in ptc.tensors))} in all")  # fmt: skip
    lines += _split_lines(meta)
    to = "dp=N,pp=P" if meta.layers else "dp=N" if meta.why_fixed else "dp=N,tp=M"
    lines.append(f"  reshard it with: tenplex reshard {path} --from deepspeed --to {to} --out OUT")
    return lines


def _split_lines(meta: DeepSpeedMeta) -> list[str]:
    """How the parameters split over TP (from universal_checkpoint_info), or why TP is fixed."""
    if meta.layers:
        stages = ", ".join(f"[{a}, {b})" for a, b in zip(meta.parts, meta.parts[1:]))
        fits = " or ".join(repr(m) for m in meta.pp_methods) or "neither of DeepSpeed's methods: PP cannot change"
        return [f"  pipeline stages hold layers {stages} (partition_method {fits}); TP stays 1"]
    if meta.why_fixed:
        return [f"  TP cannot change: {meta.why_fixed}; the DP world size can"]
    out = ["  TP split (universal_checkpoint_info):"]
    for dim, words in ((0, "split dim 0 (column)"), (1, "split dim 1 (row)"), (None, "replicated")):
        names = [k for k, _, _ in meta.module if meta.split.get(k, -2) == dim]
        if names:
            out[0] += f" {words}: {', '.join(names)};"
    return [out[0].rstrip(";")]


def _fill(streamed: StreamedArrays) -> Fill:
    """The plan's ops of each dst sub-tensor applied straight into the writer's buffer."""

    def fill(sid: str, target: np.ndarray) -> None:
        apply_ops(streamed.ops.get(sid, []), streamed.src, streamed.dst, streamed.src_arrays, target)

    return fill


def _number(v: object) -> object:
    return v.item() if hasattr(v, "item") else v
