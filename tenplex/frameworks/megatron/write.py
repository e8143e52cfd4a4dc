"""Write the PTC triple as a Megatron-LM legacy checkpoint tree in `meta`'s layout.

Per (tp, pp) rank, `model_optim_rng.pt` holds the top-level keys in the source's order:
- `args`: the source Namespace rewritten for the layout (`megatron.args.args_for`);
- `checkpoint_version`: the source's, or 3.0 when the source predates the grouped QKV layout
  (the reader converted it);
- `iteration`: from the partitions' `iteration` values (all equal);
- `model` (or `model0..model{v-1}`): nested dicts (legacy) or flat keys (mcore), in state-dict
  order, with `_extra_state` of the source's mcore modules reset to None;
- `optimizer`: Adam state bound by name (`megatron.optim`) or, with the distributed optimizer,
  param groups only plus `distrib_optim.pt` (`megatron.distrib`);
- `rng_state`: re-derived from args.seed and the partition's `rng` offsets (`megatron.rng`);
- every other source entry (opt_param_scheduler, num_floating_point_operations_so_far, ...) as read.

The tree is written into a temporary directory beside `out_dir` and renamed at the end; an I/O
error (a full disk, ...) raises CheckpointFormatError naming the file and the errno, and leaves
nothing behind.

Invariants: nothing is written unless every sub-tensor the layout needs has an array of its local
shape and dtype (CheckpointFormatError names the sub-tensor); `out_dir` is complete or absent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tenplex.frameworks.megatron.args import args_for
from tenplex.frameworks.megatron.distrib import bucket_size, chunk_layout, fragments, numel, write_buffers
from tenplex.frameworks.megatron.meta import MegatronMeta
from tenplex.frameworks.megatron.names import is_chunk_key, nest
from tenplex.frameworks.megatron.optim import adam_state, distrib_state
from tenplex.frameworks.megatron.rng import rng_state
from tenplex.frameworks.megatron.tensors import to_torch, torch_dtype
from tenplex.frameworks.megatron.tree import TRACKER, CheckpointFormatError, Tree, atomic_dir
from tenplex.frontends.optimizer import optim_kinds, optim_tensor
from tenplex.frontends.transformer import Stage, build_ptc, model_partition_id, stage_params
from tenplex.ir.files import os_error_of, write_failure
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import np_dtype


def write_megatron(ptc: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]],
                   meta: MegatronMeta, out_dir: str | os.PathLike) -> Path:  # fmt: skip
    """Write the checkpoint tree of `ptc` (the layout `meta.parallel`) into `out_dir`; returns it.

    Raises:
        CheckpointFormatError: a sub-tensor has no array or a wrong one, the partitions disagree
            on the iteration, or `out_dir` exists.
    """
    expected = build_ptc(meta.model, meta.parallel, meta.cluster)
    if ptc.subtensor_map.keys() != expected.subtensor_map.keys():
        odd = sorted(ptc.subtensor_map.keys() ^ expected.subtensor_map.keys())[0]
        raise CheckpointFormatError(f"the PTC is not layout {meta.parallel} of the checkpoint's model: "
                                    f"sub-tensor {odd!r} is in only one of them")  # fmt: skip
    _check(expected, arrays)
    iteration = _iteration(expected, values)
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        tree = Tree(tmp, iteration, meta.release)
        writer = _Writer(meta, arrays, values, iteration)
        for pp in range(meta.parallel.pp):
            stage = stage_params(meta.model, meta.parallel, pp)
            for tp in range(meta.parallel.tp):
                file = tree.model_file(tp, pp, meta.parallel.pp)
                _save(writer.state(stage, pp, tp), file, tmp, out)
                if meta.parallel.zero and meta.model.has_optimizer:
                    _save(writer.distrib(stage, pp, tp), tree.optim_file(tp, pp, meta.parallel.pp), tmp, out)
        _save("release" if meta.release else str(iteration), tmp / TRACKER, tmp, out)
    return out


def _save(obj: Any, file: Path, tmp: Path, out: Path) -> None:
    """`torch.save` `obj` (text: write it) into `file` through a Python file object, so that a
    failed write raises OSError with its errno; reported as the file of `out` it was to become."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(file, "wb") as f:
            if isinstance(obj, str):
                f.write(obj.encode())
            else:
                torch.save(obj, f)
    except (OSError, RuntimeError) as e:  # torch's zip writer wraps the OSError in a RuntimeError
        cause = os_error_of(e)
        if cause is None:
            raise
        raise write_failure(out / file.relative_to(tmp), cause, CheckpointFormatError) from None


def _check(ptc: PTC, arrays: Mapping[str, np.ndarray]) -> None:
    for st in ptc.subtensors:
        a = arrays.get(st.id)
        dtype = ptc.tensor_map[st.tensor].dtype
        if a is None or a.shape != st.shape or a.dtype != np_dtype(dtype):
            got = "no array" if a is None else f"an array {a.dtype}{list(a.shape)}"
            raise CheckpointFormatError(f"sub-tensor {st.id!r}: {got}, expected {dtype}{list(st.shape)}")


def _iteration(ptc: PTC, values: Mapping[str, Mapping[str, Any]]) -> int:
    seen = {values.get(p.id, {}).get("iteration") for p in ptc.partitions if "iteration" in p.value_map}
    if len(seen) != 1 or not isinstance(next(iter(seen)), int):
        raise CheckpointFormatError(f"partitions disagree on the iteration or lack it: {sorted(map(repr, seen))}")
    return seen.pop()


class _Writer:
    """Builds the state dicts of one layout's rank files."""

    def __init__(self, meta: MegatronMeta, arrays: Mapping[str, np.ndarray], values: Mapping, iteration: int):
        self.meta, self.arrays, self.values, self.iteration = meta, arrays, values, iteration

    def state(self, stage: Stage, pp: int, tp: int) -> dict:
        meta, pid = self.meta, model_partition_id(self.meta.parallel, pp, tp)
        own = {
            "args": lambda: args_for(meta.args, meta.model, meta.parallel, pp, tp),
            "checkpoint_version": lambda: meta.checkpoint_version if meta.checkpoint_version >= 2.0 else 3.0,
            "iteration": lambda: self.iteration,
            "optimizer": lambda: self._optimizer(stage, pid),
            "rng_state": lambda: self._rng(pid),
        }
        out: dict[str, Any] = {}
        copied = dict(meta.copied)
        for key in meta.top:
            if is_chunk_key(key):
                for chunk, params in stage:
                    out.setdefault(chunk.prefix, self._chunk(params, pid, chunk.last))
            elif key in own and not (key == "optimizer" and meta.groups is None) and not (key == "rng_state" and meta.rng is None):
                out[key] = own[key]()
            elif key in copied:
                out[key] = copied[key]
        return out

    def _chunk(self, params: list, pid: str, last: bool) -> dict:
        flat = {
            key: None if param is None else to_torch(self.arrays[f"{pid}/{param.label}"])
            for key, param in self.meta.naming.chunk_keys(params, self.meta.extra_modules, last)
        }
        return nest(flat) if self.meta.naming.family == "legacy" else flat

    def _ordered(self, stage: Stage) -> list:
        return [p for _, params in stage for p in self.meta.naming.order(params)]

    def _optimizer(self, stage: Stage, pid: str) -> Any:
        meta = self.meta
        scaler = None if meta.groups.scaler is None else dict(meta.groups.scaler)
        if meta.parallel.zero:
            return distrib_state(self._ordered(stage), meta.groups, meta.group_rule, scaler)
        tensors = {
            p.label: {k: to_torch(self.arrays[f"{pid}/{optim_tensor(k, p.label)}"]) for k in optim_kinds(meta.model)}
            for p in self._ordered(stage)
        }
        return adam_state(self._ordered(stage), tensors, meta.groups, meta.group_rule, meta.model.dtype != "float32", scaler)

    def _rng(self, pid: str) -> list[dict]:
        args, (keys, trackers, width) = self.meta.args, self.meta.rng
        dp = self.meta.parallel.dp or 1
        seed = int(getattr(args, "seed", 1234))
        return rng_state(seed, self.values[pid]["rng"], dp, bool(getattr(args, "data_parallel_random_init", False)),
                         keys, trackers, width)  # fmt: skip

    def distrib(self, stage: Stage, pp: int, tp: int) -> dict:
        """The distrib_optim.pt object of rank (pp, tp): fragments assembled, placed in world buffers."""
        meta, par, model = self.meta, self.meta.parallel, self.meta.model
        ordered = self._ordered(stage)
        flat = {p.label: {k: np.zeros(numel(model, p, par.tp), np.float32) for k in ("fp32_param", "exp_avg", "exp_avg_sq")}
                for p in ordered}  # fmt: skip
        for d, items in fragments(model, stage, par.tp, par.dp).items():
            for label, start, stop in items:
                for kind in optim_kinds(model):
                    flat[label][kind][start:stop] = self.arrays[f"pp{pp}-tp{tp}-dp{d}/{optim_tensor(kind, label)}"]
        if model.dtype == "float32":  # the masters are the parameters themselves
            pid = model_partition_id(par, pp, tp)
            for p in ordered:
                flat[p.label]["fp32_param"] = self.arrays[f"{pid}/{p.label}"].ravel()
        layouts = [chunk_layout(model, meta.naming.order(params), par.tp, par.pp, par.dp,
                                bucket_size(meta.args, par.dp, pp, chunk.vp)) for chunk, params in stage]  # fmt: skip
        key = meta.dtype_key if meta.dtype_key is not None else (torch_dtype(model.dtype), torch.float32)
        return write_buffers(layouts, flat, key)
