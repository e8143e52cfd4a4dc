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

from tenplex.frameworks.deepspeed.files import MODEL_FILE, DeepSpeedError, ZeroStageEnum, fragment_address, save
from tenplex.frameworks.deepspeed.layout import FlatGroup
from tenplex.frameworks.deepspeed.meta import MASTER, DeepSpeedMeta
from tenplex.frameworks.megatron.tensors import to_numpy, torch_dtype
from tenplex.ir.files import atomic_dir
from tenplex.ir.ptc import PTC

Fill = Callable[[str, np.ndarray], None]  # (sub-tensor id, its local array to write into)


def write_deepspeed(ptc: PTC, arrays: Mapping[str, np.ndarray] | Fill, meta: DeepSpeedMeta, dp: int,
                    out_dir: str | os.PathLike) -> Path:  # fmt: skip
    """Write `ptc` (`meta.build_ptc(meta, dp)`) into `out_dir`; returns it. `arrays` holds each
    sub-tensor's array, or is a `Fill` that writes it into the place the file needs it (a slice
    of a rank's flat partition), so a plan can be applied with no intermediate copy."""
    if isinstance(arrays, Mapping):
        missing = [st.id for st in ptc.subtensors if st.id not in arrays]
        if missing:
            raise DeepSpeedError(f"{out_dir}: no array for sub-tensor {missing[0]!r}")
        arrays = _copier(arrays)
    out = Path(out_dir)
    flat = meta.flat_groups(dp)
    with atomic_dir(out, DeepSpeedError) as tmp:
        (tmp / meta.tag).mkdir()
        model = {"module": _module(meta, arrays), **meta.model_states, "dp_world_size": dp}
        save(model, tmp / meta.tag / MODEL_FILE.format(0))
        for r in range(dp):
            sd = _rank_state(meta, flat, arrays, r)
            save({"optimizer_state_dict": sd, **meta.top}, tmp / meta.tag / f"{meta.prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        (tmp / "latest").write_text(meta.tag)
    return out


def _copier(arrays: Mapping[str, np.ndarray]) -> Fill:
    def fill(sid: str, target: np.ndarray) -> None:
        target[...] = arrays[sid].reshape(target.shape)

    return fill


def _module(meta: DeepSpeedMeta, fill: Fill) -> collections.OrderedDict:
    out = collections.OrderedDict()
    for k, dtype, shape in meta.module:
        out[k] = torch.empty(shape, dtype=torch_dtype(dtype))
        fill(f"dp0/module/{k}", to_numpy(out[k], Path("<module>"), k))
    return out


def _rank_state(meta: DeepSpeedMeta, flat: tuple[FlatGroup, ...], fill: Fill, r: int) -> dict[str, Any]:
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
                fill(f"dp{r}/{kind}/{f.name}", flat_part[f.offset:f.offset + f.stop - f.start])
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
