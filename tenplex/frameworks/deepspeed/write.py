"""Write the PTC triple as a DeepSpeed ZeRO-1/2 checkpoint with `dp` DP ranks, as DeepSpeed
itself saves one at that world size (rigid, i.e. not `elastic_checkpoint`), so that
`engine.load_checkpoint` with `dp` ranks loads it, optimizer state included.

Files in `out_dir`: `latest` (the tag), `<tag>/mp_rank_00_model_states.pt` (the source's model
file, `module` from the arrays, `dp_world_size` = dp) and per DP rank r
`<tag>/[bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt` =
`{'optimizer_state_dict': sd, 'ds_config', 'ds_version'}`, with sd as `stage_1_and_2.state_dict`
builds it: `single_partition_of_fp32_groups` (padding stripped), `base_optimizer_state` (the
inner optimizer's `state_dict`: per group one flat state of the partition size, padding
zeroed, and the group's `step`; for an elastic source, which holds no param groups, the
elastic form: per group the moments without padding, and `base_optimizer_state_step`: the
source's, else the groups' common `step`, without which DeepSpeed 0.19.8 cannot load an
elastic checkpoint, its own of a torch optimizer included), `group_paddings`, `param_alignment_paddings` (0s),
`partition_count`, `param_slice_mappings`, and the source's loss scaler and scalars.

With `tp` model-parallel ranks (`mp_rank_{m:02d}` in every name), rank m's model file holds its
local `module` tensors; at the source's TP each rank's own model file is kept, at another TP
rank 0's, with `param_shapes`, `mp_world_size` and `checkpoint_parallel_dimensions` of the new TP
(client state such as RNG states is rank 0's). A pipeline's layer files and stage model files:
`stages.py`.

`out_dir` is written beside itself and renamed: complete or absent (DeepSpeedError names the file
on an I/O error).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tenplex.frameworks.deepspeed.files import (
    MODEL_FILE,
    DeepSpeedError,
    ZeroStageEnum,
    fragment_address,
    save,
    zero_name,
)
from tenplex.frameworks.deepspeed.layout import FlatGroup
from tenplex.frameworks.deepspeed.meta import MASTER, DeepSpeedMeta, pid
from tenplex.frameworks.deepspeed.stages import stage_states, write_layers
from tenplex.frameworks.megatron.tensors import to_numpy, torch_dtype
from tenplex.ir.files import atomic_dir
from tenplex.ir.ptc import PTC

Fill = Callable[[str, np.ndarray], None]  # (sub-tensor id, its local array to write into)


def write_deepspeed(ptc: PTC, arrays: Mapping[str, np.ndarray] | Fill, meta: DeepSpeedMeta, dp: int,
                    out_dir: str | os.PathLike, tp: int | None = None, parts: tuple[int, ...] | None = None) -> Path:  # fmt: skip
    """Write `ptc` (`meta.build_ptc(meta, dp, tp, parts)`) into `out_dir`; returns it. `arrays` holds each
    sub-tensor's array, or is a `Fill` that writes it into the place the file needs it (a slice
    of a rank's flat partition), so a plan can be applied with no intermediate copy."""
    tp = meta.tp if tp is None else tp
    parts = parts or meta.parts
    if isinstance(arrays, Mapping):
        missing = [st.id for st in ptc.subtensors if st.id not in arrays]
        if missing:
            raise DeepSpeedError(f"{out_dir}: no array for sub-tensor {missing[0]!r}")
        arrays = _copier(arrays)
    out = Path(out_dir)
    n = meta.ranks(tp, parts)
    with atomic_dir(out, DeepSpeedError) as tmp:
        (tmp / meta.tag).mkdir()
        if meta.layers:
            write_layers(meta, arrays, tmp / meta.tag, parts)
        for m in range(n):
            module = None if meta.layers else _module(meta, arrays, m, tp)
            states = stage_states(meta, m, parts) if meta.layers else _model_states(meta, m, tp)
            save({"module": module, **states, "dp_world_size": dp}, tmp / meta.tag / MODEL_FILE.format(m))
            flat = meta.flat_groups(dp, tp, m, parts)
            for r in range(dp):
                sd = _rank_state(meta, flat, arrays, pid(m, r, n), r)
                save({"optimizer_state_dict": sd, **meta.top}, tmp / meta.tag / zero_name(meta.prefix, r, m))
        (tmp / "latest").write_text(meta.tag)
    return out


def _model_states(meta: DeepSpeedMeta, m: int, tp: int) -> dict[str, Any]:
    """Rank m's model file without `module`: its own at the source's TP; else rank 0's, with
    the shapes and model-parallel sizes of the new TP."""
    if tp == meta.tp:
        return meta.model_states if m == 0 else meta.other_states[m - 1]
    states = dict(meta.model_states, mp_world_size=tp)
    states["param_shapes"] = [collections.OrderedDict((n, torch.Size(meta.local(n, s, tp))) for n, s in g) for g in meta.groups]
    dims = states.get("checkpoint_parallel_dimensions")
    if isinstance(dims, dict):
        states["checkpoint_parallel_dimensions"] = {**dims, "tp_degree": tp}
    return states


def _copier(arrays: Mapping[str, np.ndarray]) -> Fill:
    def fill(sid: str, target: np.ndarray) -> None:
        target[...] = arrays[sid].reshape(target.shape)

    return fill


def _module(meta: DeepSpeedMeta, fill: Fill, m: int, tp: int) -> collections.OrderedDict:
    out = collections.OrderedDict()
    for k, dtype, shape in meta.module:
        out[k] = torch.empty(meta.local(k, shape, tp), dtype=torch_dtype(dtype))
        fill(f"{pid(m, 0, tp)}/module/{k}", to_numpy(out[k], Path("<module>"), k))
    return out


def _rank_state(meta: DeepSpeedMeta, flat: tuple[FlatGroup, ...], fill: Fill, part: str, r: int) -> dict[str, Any]:
    fp32, state, mappings = [], {}, []
    for g, group in enumerate(flat):
        frags = list(group.fragments(r))
        parts = {}
        for kind in meta.kinds:  # fp32 (and elastic moments) without padding, rigid moments with
            size = group.partition_size if kind != MASTER and meta.param_groups else group.valid(r)
            parts[kind] = torch.empty(size, dtype=torch.float32)
            flat_part = parts[kind].numpy()
            flat_part[group.valid(r):] = 0
            for f in frags:
                fill(f"{part}/{kind}/{f.name}", flat_part[f.offset:f.offset + f.stop - f.start])
        fp32.append(parts[MASTER])
        state[g] = {**{k: _copy(v) for k, v in meta.scalars[g].items()}, **{k: parts[k] for k in meta.states}}
        mappings.append(collections.OrderedDict((f.name, fragment_address(f.stop - f.start, f.offset)) for f in frags))
    if meta.param_groups:
        base: Any = {"state": state, "param_groups": [{**pg, "params": [g]} for g, pg in enumerate(meta.param_groups)]}
        steps = {}
    else:  # an elastic source holds no param groups: written elastic too (moments without padding)
        base = [state[g] for g in range(len(flat))]
        steps = {"base_optimizer_state_step": _elastic_step(meta)}
    opt = meta.optimizer
    return {
        "loss_scaler": opt.get("loss_scaler"), "dynamic_loss_scale": opt.get("dynamic_loss_scale", False),
        "overflow": opt.get("overflow", False), "clip_grad": opt.get("clip_grad", 0.0),
        "base_optimizer_state": base, **steps,
        "single_partition_of_fp32_groups": fp32,
        "zero_stage": ZeroStageEnum(meta.stage or 1), "group_paddings": [g.padding(r) for g in flat],
        "param_alignment_paddings": [[0] * len(g.params) for g in flat], "partition_count": [g.dp for g in flat],
        "ds_version": opt.get("ds_version", meta.top.get("ds_version")), "param_slice_mappings": mappings,
    }  # fmt: skip


def _elastic_step(meta: DeepSpeedMeta) -> Any:
    if "base_optimizer_state_step" in meta.optimizer:
        return meta.optimizer["base_optimizer_state_step"]
    steps = [s.get("step") for s in meta.scalars]
    if any(x is None or not _equal(x, steps[0]) for x in steps):
        raise DeepSpeedError(f"param groups disagree on 'step' ({steps}): an elastic checkpoint holds one step for all")
    return _copy(steps[0])


def _equal(a: Any, b: Any) -> bool:
    return bool(torch.equal(a, b)) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b


def _copy(v: Any) -> Any:
    return v.clone() if isinstance(v, torch.Tensor) else v
