"""Reshard a Megatron `torch_dist` checkpoint into another tp x pp x dp layout, as `torch_dist`.

    reshard_megatron_dist(SRC, "tp=4,pp=1[,dp=2]", OUT)

1. read SRC (`read.py`): the DCP state as a PTC triple, memory-mapped, plus `common.pt` and
   `metadata.json`;
2. the target PTC (`layout.dst_ptc`): the same global tensors cut as megatron-core cuts them for
   the target (per-layer chunks kept, the TP axis recut), one partition per target rank;
3. compile and verify the plan and move the bytes (`dcp.reshard.reshard_arrays`);
4. write OUT with DCP's writer (`dcp.write.write_dcp`: rank r writes `__r_0.distcp`), then
   `common.pt` with `args` set to the target layout and `metadata.json` as the source's; in a
   Megatron-LM tree also the tracker. OUT is complete or absent.

Sharded objects are carried beside the plan (rank 0 writes them all) and keep their keys, except the RNG state, which Megatron keys by the (pp, tp) grid
(`rng_state/shard_<pp>.<tp>_<PP>.<TP>`): under a new tp or pp it is re-derived from `args.seed`
by Megatron's seed rules (`megatron.rng`; a fresh stream per rank, as the legacy path does).

Refused (CheckpointFormatError, saying why): a `dp_reshardable` distributed-optimizer state under
a new tp or pp. Its keys name a TP x PP group's flat bucket buffers; which parameter a bucket
offset holds depends on the model's parameter order and padding, which the checkpoint does not
record, so tenplex cannot place it in another group's buckets (Megatron cannot either and refuses
at load). A new dp alone keeps the buffers, as Megatron does.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from tenplex.frameworks.dcp.reshard import reshard_arrays
from tenplex.frameworks.dcp.write import write_dcp
from tenplex.frameworks.dtensor.values import value_from_bytes
from tenplex.frameworks.megatron.args import parse_layout
from tenplex.frameworks.megatron.rng import KEYS, TRACKERS, rng_state
from tenplex.frameworks.megatron.tree import CheckpointFormatError, atomic_dir
from tenplex.frameworks.megatron_dist.files import write_side_files, write_tracker
from tenplex.frameworks.megatron_dist.layout import Layout, dst_ptc
from tenplex.frameworks.megatron_dist.read import DP_RESHARDABLE, DistCheckpoint, read_megatron_dist
from tenplex.ir.ptc import PTC, Value

_RNG = re.compile(r"rng_state/shard_[\d.]+_[\d.]+")


@attrs.frozen
class DistReshardResult:
    """What `reshard_megatron_dist` did."""

    src: str
    out: str
    src_layout: Layout
    dst_layout: Layout
    workers: int
    bytes_moved: int
    seconds: dict[str, float]

    def summary(self) -> str:
        return (f"tenplex: resharded Megatron torch_dist {self.src} ({self.src_layout}) into {self.out} "
                f"({self.dst_layout}) with {self.workers} worker(s); {self.bytes_moved} B moved between ranks, plan verified")  # fmt: skip


def target_layout(src: Layout, to: str) -> Layout:
    """`tp=..,pp=..[,dp=..]` as a Layout; dp defaults to the source's."""
    fields = parse_layout(to)
    odd = sorted(set(fields) - {"tp", "pp", "dp"})
    if odd:
        raise CheckpointFormatError(f"layout {to!r}: {', '.join(odd)} not supported for torch_dist checkpoints (tp, pp, dp are)")
    sizes = {k: fields.get(k, getattr(src, k)) for k in ("tp", "pp", "dp")}
    if min(sizes.values()) < 1:
        raise CheckpointFormatError(f"layout {to!r}: tp, pp and dp must be >= 1")
    return Layout(**sizes)


def reshard_megatron_dist(src_dir: str | os.PathLike, to: str, out_dir: str | os.PathLike, workers: int = 1, *,
                          trust_pickles: bool = False) -> DistReshardResult:  # fmt: skip
    """Reshard SRC into layout `to` and write OUT (see the module docstring)."""
    clock = {"read": time.perf_counter()}
    out = Path(out_dir)
    if out.exists():
        raise CheckpointFormatError(f"{out}: already exists (refusing to overwrite)")
    ckpt = read_megatron_dist(src_dir, trust_pickles=trust_pickles)
    dst_layout = target_layout(ckpt.layout, to)
    check_reshardable(ckpt, dst_layout)
    clock["plan"] = time.perf_counter()
    values = _values(ckpt, dst_layout)
    dst = dst_ptc(ckpt.ptc, ckpt.layout, dst_layout, {name: Value() for name in values})
    arrays, _, plan = reshard_arrays(_bare(ckpt.ptc), ckpt.arrays, {}, _bare(dst), workers, clock=clock, stream=workers == 1)
    clock["write"] = time.perf_counter()
    with atomic_dir(out) as tmp:
        step = tmp if ckpt.where.root is None else tmp / ckpt.where.step.name
        write_dcp(dst, arrays, {"rank0": values}, tmp / ".dcp")
        step.mkdir(exist_ok=True)
        for f in (tmp / ".dcp").iterdir():
            f.rename(step / f.name)
        (tmp / ".dcp").rmdir()
        write_side_files(step, ckpt.config, _common(ckpt.common, dst_layout))
        if ckpt.where.root is not None:
            write_tracker(tmp, ckpt.where.step.name)
    clock["done"] = time.perf_counter()
    steps = list(clock)
    seconds = {k: clock[n] - clock[k] for k, n in zip(steps, steps[1:])}
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    return DistReshardResult(str(src_dir), str(out), ckpt.layout, dst_layout, workers, moved, seconds)


def check_reshardable(ckpt: DistCheckpoint, dst: Layout) -> None:
    """Raises CheckpointFormatError for a `dp_reshardable` optimizer under a new tp or pp."""
    src = ckpt.layout
    if ckpt.optimizer == "dp_reshardable" and (src.tp, src.pp) != (dst.tp, dst.pp):
        key = next(t.name for t in ckpt.ptc.tensors if t.name.startswith(DP_RESHARDABLE))
        raise CheckpointFormatError(
            f"{ckpt.where.step}: the distributed optimizer state is saved dp_reshardable ({key!r}: flat bucket "
            f"buffers of one TP x PP group), which cannot move from tp={src.tp},pp={src.pp} to tp={dst.tp},pp={dst.pp}: "
            "the checkpoint does not record which parameter each bucket offset holds (that follows the model's "
            "parameter order and padding). Save with --dist-ckpt-optim-fully-reshardable, or change only dp")


def _bare(ptc: PTC) -> PTC:
    """`ptc` without values: the sharded objects are carried past the plan (`_values`)."""
    partitions = tuple(attrs.evolve(p, values=()) for p in ptc.partitions)
    return PTC(ptc.tensors, ptc.subtensors, partitions, ptc.allocation, ptc.topology)


def _values(ckpt: DistCheckpoint, dst: Layout) -> dict[str, Any]:
    """The target's sharded objects (all written by rank 0): the source's, with the RNG state
    re-derived on a new grid."""
    found = {name: value for values in ckpt.values.values() for name, value in values.items()}
    src = ckpt.layout
    if (src.tp, src.pp) == (dst.tp, dst.pp) or not any(_RNG.fullmatch(n) for n in found):
        return found
    out = {n: v for n, v in found.items() if not _RNG.fullmatch(n)}
    args = ckpt.common.get("args")
    seed = getattr(args, "seed", None)
    if type(seed) is not int:
        raise CheckpointFormatError(f"{ckpt.where.step}: common.pt args have no integer seed to re-derive the RNG state "
                                    f"for tp={dst.tp},pp={dst.pp} from")  # fmt: skip
    per_dp = bool(getattr(args, "data_parallel_random_init", False))
    for p in range(dst.pp):
        for t in range(dst.tp):
            state = rng_state(seed, {"seed_offset": 100 * p, "model_parallel_seed_offset": 2718 + t}, dst.dp, per_dp, KEYS, TRACKERS)
            buf = io.BytesIO()
            torch.save(state, buf)
            out[f"rng_state/shard_{p}.{t}_{dst.pp}.{dst.tp}"] = value_from_bytes(buf.getvalue())
    return out


def _common(common: dict[str, Any], dst: Layout) -> dict[str, Any]:
    """`common.pt` for the target: `args` with the target's parallel sizes and world size."""
    args = common.get("args")
    if not isinstance(args, argparse.Namespace):
        return common
    sizes = {"tensor_model_parallel_size": dst.tp, "pipeline_model_parallel_size": dst.pp,
             "data_parallel_size": dst.dp, "world_size": dst.world}  # fmt: skip
    new = argparse.Namespace(**{**vars(args), **{k: v for k, v in sizes.items() if k != "world_size" or hasattr(args, k)}})
    return {**common, "args": new}

