"""Reshard a Megatron-LM legacy checkpoint to another layout, and describe one in plain words.

`reshard_megatron(src_dir, to, out_dir, workers=1)` reads SRC (`read_megatron`), builds the
frontend's PTC of the same model in the target layout, compiles the plan (`compile_plan`, verified),
executes it in-process (workers == 1) or on local agent processes (`Runtime.local`), and writes the
Megatron tree (`write_megatron`, atomic). The src and dst PTCs are re-homed onto the workers by
`tenplex.runtime.reshard.rehome`, and run by its `execute_steps`, exactly as `tenplex reshard` does.

`to` is a `ParallelConfig`, a layout string `tp=4,pp=1[,dp=2][,vpp=2][,zero=1][,first=N][,last=N]`
(dp and zero default to the source's; the model always comes from the checkpoint), the same as a
dict, or a compact job spec / `JobSpec` whose model must equal the checkpoint's.

Invariants: OUT_DIR is complete or absent; the plan is verified before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.compiler import compile_plan
from tenplex.frameworks.megatron.args import parse_layout
from tenplex.frameworks.megatron.meta import MegatronCheckpoint, MegatronMeta, cluster_for
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.frameworks.megatron.write import write_megatron
from tenplex.frontends.parallel import ParallelConfig, fit
from tenplex.frontends.spec import JobSpec, parse_spec
from tenplex.frontends.transformer import build_ptc, model_partition_id
from tenplex.ir.errors import SpecError
from tenplex.ir.ptc import PTC
from tenplex.runtime.reshard import execute_steps, rehome  # the runtime's own execution path, reused as is
from tenplex.runtime.runtime import Clock


@attrs.frozen
class MegatronReshardResult:
    out_dir: str
    src: str  # the source layout, e.g. tp2,pp2,dp1
    dst: str
    bytes_moved: int  # bytes that crossed devices, from the verified plan
    seconds: float
    phases: tuple[tuple[str, float], ...] = ()  # seconds of read, compile, execute, write

    def summary(self) -> str:
        from tenplex.compiler.emit import human_bytes

        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.phases)
        return (f"tenplex: resharded Megatron {self.src} -> {self.dst} into {self.out_dir}: "
                f"{human_bytes(self.bytes_moved)} moved between ranks, {self.seconds:.2f}s ({parts}); plan verified")  # fmt: skip


def target_layout(meta: MegatronMeta, to: Any) -> ParallelConfig:
    """The fitted target layout of `meta.model` for `to` (see the module docstring).

    Raises:
        SpecError: the layout is malformed, does not fit the model, or names another model.
    """
    src = meta.parallel
    if isinstance(to, str) and "@" in to:
        to = parse_spec(to)
    if isinstance(to, JobSpec):
        if to.model != meta.model:
            raise SpecError(f"target spec model {to.model} differs from the checkpoint's model {meta.model}")
        to = to.parallel
    if isinstance(to, str):
        to = parse_layout(to)
    if isinstance(to, Mapping):
        fields = {"dp": src.dp, "zero": src.zero, **to}
        try:
            to = ParallelConfig(**fields)
        except TypeError as e:
            raise SpecError(f"layout {dict(to)}: {e}") from None
    if not isinstance(to, ParallelConfig):
        raise SpecError(f"target layout {to!r} is not a layout string, dict, ParallelConfig or job spec")
    if to.dp is None:
        to = attrs.evolve(to, dp=src.dp)
    return fit(meta.model, to, cluster_for(to))


def _plan_and_run(src: MegatronCheckpoint, dst: PTC, workers: int, timeout: float, clock: Clock) -> tuple[dict, dict, int]:
    src_h, dst_h = rehome(src.ptc, dst, workers)
    plan = compile_plan(src_h, dst_h)
    clock.lap("compile")
    first = {p.id: src_h.allocation.devices_of(p.id)[0] for p in src_h.partitions}
    arrays = {(sid, first[src_h.partition_of[sid]]): a for sid, a in src.arrays.items()}
    values = {(pid, first[pid]): v for pid, v in src.values.items()}
    got_arrays, got_values = execute_steps([(plan, src_h, dst_h)], arrays, values, workers, timeout, 20 * timeout, None)
    placed = dst_h.with_allocation(plan.allocation)
    home = {p.id: placed.allocation.devices_of(p.id)[0] for p in placed.partitions}
    out_arrays = {st.id: got_arrays[(st.id, home[placed.partition_of[st.id]])] for st in placed.subtensors}
    out_values = {pid: got_values.get((pid, d), {}) for pid, d in home.items()}
    clock.lap("execute")
    return out_arrays, out_values, plan.stats.host_bytes + plan.stats.network_bytes


def reshard_megatron(src_dir: str | os.PathLike, to: Any, out_dir: str | os.PathLike, workers: int = 1, *,
                     vocab: int | None = None, timeout: float = 30.0, trust_pickles: bool = False) -> MegatronReshardResult:  # fmt: skip
    """Reshard the Megatron checkpoint at `src_dir` to layout `to` into `out_dir`
    (`trust_pickles`: see `read_megatron`).

    Raises:
        CheckpointFormatError: SRC does not match its layout, needs a class outside the pickle
            allow-list, or OUT_DIR exists; an I/O error while writing OUT_DIR (names the file).
        SpecError: the target layout is malformed or does not fit the model.
        CompileError, ExecutionError: from the compiler and the runtime.
    """
    clock = Clock()
    if Path(out_dir).exists():
        raise CheckpointFormatError(f"{out_dir}: already exists (refusing to overwrite)")
    src = read_megatron(src_dir, vocab=vocab, trust_pickles=trust_pickles)
    parallel = target_layout(src.meta, to)
    dst = build_ptc(src.meta.model, parallel, cluster_for(parallel))
    clock.lap("read")
    arrays, values, moved = _plan_and_run(src, dst, workers, timeout, clock)
    write_megatron(dst, arrays, values, src.meta.with_layout(parallel), out_dir)
    clock.lap("write")
    return MegatronReshardResult(str(out_dir), str(src.meta.parallel), str(parallel), moved,
                                 sum(clock.phases.values()), tuple(clock.phases.items()))  # fmt: skip


def inspect_megatron(src_dir: str | os.PathLike, *, vocab: int | None = None, trust_pickles: bool = False) -> list[str]:
    """Plain-words findings about a Megatron checkpoint: layout, model, vocabulary padding, tied
    embeddings, optimizer state and RNG.

    Raises:
        CheckpointFormatError: the checkpoint does not read (as `read_megatron`): a checkpoint
            that cannot be resharded is not described as if it could."""
    return megatron_findings(read_megatron(src_dir, vocab=vocab, trust_pickles=trust_pickles))


def megatron_findings(ckpt: MegatronCheckpoint) -> list[str]:
    """`inspect_megatron`'s findings about a checkpoint already read."""
    meta, model, par = ckpt.meta, ckpt.meta.model, ckpt.meta.parallel
    step = "release" if meta.release else f"iteration {ckpt.values[model_partition_id(par, 0, 0)]['iteration']}"
    out = [
        f"Megatron legacy checkpoint, {step}, {meta.naming.family} parameter names"
        f"{' (Transformer Engine)' if meta.naming.te else ''}, checkpoint_version {meta.checkpoint_version}",
        f"layout: tp={par.tp}, pp={par.pp}, dp={par.dp}, vpp={par.vpp}"
        f"{', distributed optimizer' if par.zero else ''}; {par.tp * par.pp} rank files",
        f"model: {model.num_layers} layers, hidden {model.hidden}, {model.heads} heads ({model.query_groups} query "
        f"groups), ffn {model.ffn_hidden}{', SwiGLU' if model.glu else ''}, {model.norm}, {model.dtype}",
    ]
    return out + _vocab_findings(ckpt) + _optimizer_findings(ckpt) + _rng_findings(meta)


def _vocab_findings(ckpt: MegatronCheckpoint) -> list[str]:
    meta, model, par = ckpt.meta, ckpt.meta.model, ckpt.meta.parallel
    padded = int(meta.args.padded_vocab_size)
    if not meta.vocab_known:
        vocab = f"vocabulary: {padded} rows; the true size is not in args, so padding rows (if any) are kept as data"
    else:
        vocab = (f"vocabulary: {model.vocab} rows padded to {padded} ({padded - model.vocab} padding rows, multiple "
                 f"of {model.make_vocab_size_divisible_by}*tp={model.make_vocab_size_divisible_by * par.tp})")  # fmt: skip
    if not model.tied_embeddings:
        return [vocab, "embeddings: untied output layer on the last stage"]
    if par.pp == 1:
        return [vocab, "embeddings: tied; with pp=1 no head copy is stored"]
    diff = _tied_difference(ckpt)
    return [vocab, f"embeddings: tied; the last stage holds word_embeddings_for_head (max difference to the "
                   f"first stage's copy: {diff:g})"]  # fmt: skip


def _tied_difference(ckpt: MegatronCheckpoint) -> float:
    worst = 0.0
    last = ckpt.meta.parallel.pp - 1
    for tp in range(ckpt.meta.parallel.tp):
        a = ckpt.arrays[f"pp0-tp{tp}/embedding.word_embeddings.weight"].astype(np.float64)
        b = ckpt.arrays[f"pp{last}-tp{tp}/word_embeddings_for_head.weight"].astype(np.float64)
        worst = max(worst, float(np.abs(a - b).max(initial=0.0)))
    return worst


def _optimizer_findings(ckpt: MegatronCheckpoint) -> list[str]:
    meta = ckpt.meta
    if meta.groups is None:
        return ["optimizer: no optimizer state (saved with --no-save-optim); a reshard carries weights only"]
    masters = "fp32 master weights, " if meta.model.dtype != "float32" else ""
    where = "distrib_optim.pt world buffers" if meta.parallel.zero else "per-parameter state bound by name"
    order = "first appearance" if meta.group_rule is None else f"fixed {meta.group_rule}"
    return [f"optimizer: Adam with {masters}exp_avg and exp_avg_sq in {where}; {len(meta.groups.templates)} "
            f"param-group classes, ordered by {order}"]  # fmt: skip


def _rng_findings(meta: MegatronMeta) -> list[str]:
    if meta.rng is None:
        return ["rng: no rng_state saved"]
    return [f"rng: {', '.join(meta.rng[1]) or 'no trackers'}; a reshard re-derives every rank's state from "
            f"seed {getattr(meta.args, 'seed', 1234)} (seed + 100*pp, model-parallel + 2718 + tp)"]  # fmt: skip
