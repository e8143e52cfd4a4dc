"""Read a DeepSpeed ZeRO-1/2 or universal checkpoint into the PTC triple plus `DeepSpeedMeta`.

ZeRO-1/2 (`stage_1_and_2.py` `state_dict`): per DP rank d, `single_partition_of_fp32_groups[g]`
is d's fp32 partition of group g without padding, the inner optimizer state holds the moments
(with padding when saved rigid, without when `elastic_checkpoint`), and `param_slice_mappings`,
`group_paddings` and `partition_count` must agree with the layout `param_shapes` implies
(`layout.FlatGroup`); the fragments are then cut out by that layout. A universal checkpoint's
`zero/<param>/<state>.pt` hold whole tensors (`{'param': tensor, 'cat_dim': ...}`).

Refused, each with one line naming the file and key: per-parameter alignment padding
(`param_alignment_paddings` not all 0), model-parallel or pipeline files, ranks that disagree on
the step or the groups, any tensor whose size does not match the layout.

Tensor parallelism: with `mp_rank_XX` files, each model-parallel rank's files are read alike
(their `param_shapes` and `module` must agree) and placed in the global tensors by the split
`tp.splits` learns from the model file's `universal_checkpoint_info`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.frameworks.deepspeed.files import MODEL_FILE, DeepSpeedError, Located, load, locate
from tenplex.frameworks.deepspeed.meta import MASTER, DeepSpeedMeta, build_ptc, pid
from tenplex.frameworks.deepspeed.stages import join_groups, pp_meta, read_layers
from tenplex.frameworks.deepspeed.tp import INFO, UNKNOWN, global_shape, splits
from tenplex.frameworks.megatron.tensors import dtype_name, to_numpy
from tenplex.ir.ptc import PTC

_OPT_SCALARS = ("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "zero_stage", "ds_version",
                "base_optimizer_state_step")  # fmt: skip


def read_deepspeed(path: str | os.PathLike, *, trust_pickles: bool = False) -> tuple[PTC, dict, dict, DeepSpeedMeta]:
    """(PTC, sub-tensor id -> array, partition id -> values, meta) of the checkpoint at `path`
    (a root with `latest`/`latest_universal` or a tag directory). Raises DeepSpeedError."""
    loc = locate(path)
    models = [_dict(load(loc.model_file_of(m), f"DeepSpeed model states of model-parallel rank {m}", trust_pickles=trust_pickles),
                    loc.model_file_of(m)) for m in range(loc.tp)]  # fmt: skip
    model = models[0]
    if loc.kind == "universal" and model.get("mp_world_size", 1) != 1:
        raise DeepSpeedError(f"{loc.model_file}: key 'mp_world_size' is {model['mp_world_size']}: tenplex reads universal "
                             "checkpoints of one model-parallel rank (reshard the ZeRO checkpoint ds_to_universal read instead)")  # fmt: skip
    if model.get("mp_world_size", 1) != loc.tp:
        raise DeepSpeedError(f"{loc.model_file}: key 'mp_world_size' is {model['mp_world_size']}, but there are {loc.tp} model files")
    if loc.layers:
        stage_groups = [_groups(m, loc.model_file_of(s)) for s, m in enumerate(models)]
        groups = join_groups(stage_groups, loc)
        module, layer_arrays, layers = read_layers(loc, trust_pickles)
    else:
        groups, module = _groups(model, loc.model_file), _module(model, loc.model_file)
        if loc.kind == "universal":
            return _universal(loc, model, groups, module, trust_pickles)
        _check_alike(loc, models, groups, module)
    arrays: dict[str, np.ndarray] = {}
    meta = None
    for m in range(loc.tp):
        files = loc.zero_files_of(m)
        sds = [_dict(_dict(load(f, f"ZeRO optimizer state of DP rank {d}", trust_pickles=trust_pickles), f).get("optimizer_state_dict"),
                     f, "optimizer_state_dict") for d, f in enumerate(files)]  # fmt: skip
        if meta is None:
            _check_count(sds[0], loc)
            top = _dict(load(files[0], "ZeRO optimizer state of DP rank 0", trust_pickles=trust_pickles), files[0])
            meta = _meta(loc, model, groups, module, sds[0], top, files[0])
            meta = pp_meta(meta, models, layers, stage_groups) if loc.layers else _tp_meta(meta, models, loc.tp)
        _read_rank(models[m], sds, files, meta, m, arrays)
    if loc.layers:
        arrays.update({f"{pid(next(s for s in range(meta.pp) if meta.holds(k, s)), 0, meta.pp)}/module/{k}": a
                       for k, a in layer_arrays.items()})  # fmt: skip
    else:
        _check_replicas(meta, arrays, loc)
    return _result(meta, arrays)


def _check_alike(loc: Located, models: list[dict], groups: tuple, module: tuple) -> None:
    for m in range(1, loc.tp):
        if _groups(models[m], loc.model_file_of(m)) != groups or _module(models[m], loc.model_file_of(m)) != module:
            raise DeepSpeedError(f"{loc.model_file_of(m)}: key 'param_shapes' or 'module' differs from {loc.model_file.name}'s "
                                 "(tenplex reads even TP splits: every rank's shapes alike)")  # fmt: skip


def _check_replicas(meta: DeepSpeedMeta, arrays: dict, loc: Located) -> None:
    """Every TP rank's copy of a TP-replicated parameter (module and optimizer state) is the same."""
    for sid in [s for s in arrays if s.startswith("mp0dp")]:
        part, rest = sid.split("/", 1)
        if meta.split.get(rest.split("/", 1)[1], UNKNOWN) is not None:
            continue
        for m in range(1, meta.tp):
            if arrays[f"mp{m}{part[3:]}/{rest}"].tobytes() != arrays[sid].tobytes():
                file = loc.model_file_of(m) if rest.startswith("module/") else loc.zero_files_of(m)[int(part[5:])]
                raise DeepSpeedError(f"{file}: {rest} differs from model-parallel rank 0's, but '{INFO}' lists it as "
                                     "TP-replicated (tp_replicated_parameter_patterns)")  # fmt: skip


def _tp_meta(meta: DeepSpeedMeta, models: list[dict], tp: int) -> DeepSpeedMeta:
    """`meta` (shapes as read) with the TP split of each parameter and global shapes."""
    params = {n for g in meta.groups for n, _ in g}
    names = [k for k, _, _ in meta.module] + sorted(params - {k for k, _, _ in meta.module})
    split, why = splits(meta.model_states.get(INFO), names, params)
    groups = tuple(tuple((n, global_shape(s, split[n], tp)) for n, s in g) for g in meta.groups)
    module = tuple((k, d, global_shape(s, split[k], tp)) for k, d, s in meta.module)
    others = tuple({k: v for k, v in m.items() if k != "module"} for m in models[1:])
    return attrs.evolve(meta, groups=groups, module=module, tp=tp, split=split, why_fixed=why, other_states=others)


def _read_rank(model: dict, sds: list[dict], files: tuple[Path, ...], meta: DeepSpeedMeta, m: int, arrays: dict) -> None:
    """Model-parallel rank m's arrays: its module (DP rank 0's) and every DP rank's fragments."""
    for k, _, _ in () if meta.layers else meta.module:
        arrays[f"{pid(m, 0, meta.tp)}/module/{k}"] = to_numpy(model["module"][k], files[0].with_name(MODEL_FILE.format(m)), f"module/{k}")
    flat, n = meta.flat_groups(len(sds), m=m), meta.ranks(meta.tp, None)
    for d, (sd, file) in enumerate(zip(sds, files)):
        _check_rank(sd, meta, flat, d, file)
        for g, group in enumerate(flat):
            parts = {MASTER: _tensor(sd["single_partition_of_fp32_groups"], g, file, "single_partition_of_fp32_groups")}
            state = _group_state(sd, g, file)
            for kind in meta.states:
                parts[kind] = _tensor(state, kind, file, f"base_optimizer_state[{g}]")
            for kind, a in parts.items():
                if a.shape[0] not in (group.valid(d), group.partition_size):
                    raise DeepSpeedError(f"{file}: {kind} of param group {g} has {a.shape[0]} elements, expected "
                                         f"{group.valid(d)} (DP {group.dp}, {group.numel} elements in the group)")  # fmt: skip
                for f in group.fragments(d):
                    arrays[f"{pid(m, d, n)}/{kind}/{f.name}"] = a[f.offset:f.offset + f.stop - f.start]


def _result(meta: DeepSpeedMeta, arrays: dict) -> tuple[PTC, dict, dict, DeepSpeedMeta]:
    ptc = build_ptc(meta, meta.dp)
    for st in ptc.subtensors:
        if st.id not in arrays:
            raise DeepSpeedError(f"{meta.tag}: no array for sub-tensor {st.id!r}")
    return ptc, arrays, {p.id: {} for p in ptc.partitions}, meta


def _dict(value: Any, file: Path, key: str | None = None) -> dict:
    if not isinstance(value, dict):
        where = f"key {key!r}" if key else "the file"
        raise DeepSpeedError(f"{file}: {where} holds {type(value).__name__}, expected a dict")
    return value


def _groups(model: dict, file: Path) -> tuple:
    shapes = model.get("param_shapes")
    if not isinstance(shapes, list) or not shapes or not all(isinstance(g, dict) for g in shapes):
        raise DeepSpeedError(f"{file}: key 'param_shapes' missing or not a list of dicts (a ZeRO-1/2 save has one per param group)")
    return tuple(tuple((str(n), tuple(int(x) for x in s)) for n, s in g.items()) for g in shapes)


def _module(model: dict, file: Path) -> tuple:
    module = _dict(model.get("module"), file, "module")
    out = []
    for k, v in module.items():
        if not isinstance(v, torch.Tensor):
            raise DeepSpeedError(f"{file}: key 'module/{k}' holds {type(v).__name__}, expected a tensor")
        out.append((str(k), dtype_name(v, file, f"module/{k}"), tuple(v.shape)))
    return tuple(out)


def _module_arrays(model: dict, module: tuple, file: Path) -> dict[str, np.ndarray]:
    return {f"dp0/module/{k}": to_numpy(model["module"][k], file, f"module/{k}") for k, _, _ in module}


def _meta(loc: Located, model: dict, groups: tuple, module: tuple, sd: dict, top: dict, file: Path) -> DeepSpeedMeta:
    for key in ("single_partition_of_fp32_groups", "base_optimizer_state", "partition_count"):
        if key not in sd:
            raise DeepSpeedError(f"{file}: key 'optimizer_state_dict/{key}' missing (not a ZeRO-1/2 optimizer file)")
    base = sd["base_optimizer_state"]
    if isinstance(base, dict):
        state = base.get("state", {})
        per_group = [state.get(g, {}) for g in range(len(groups))]
        param_groups = [{k: v for k, v in pg.items() if k != "params"} for pg in base.get("param_groups", [])]
    else:
        per_group, param_groups = list(base), []
    states = tuple(k for k, v in per_group[0].items() if isinstance(v, torch.Tensor) and v.dim() > 0)
    scalars = tuple({k: v for k, v in s.items() if not (isinstance(v, torch.Tensor) and v.dim() > 0)} for s in per_group)
    if len(param_groups) not in (0, len(groups)) or len(sd["partition_count"]) != len(groups):
        raise DeepSpeedError(f"{file}: {len(sd['partition_count'])} param groups, the model file's param_shapes has {len(groups)}")
    optimizer = {k: sd[k] for k in _OPT_SCALARS if k in sd}
    rest = {k: v for k, v in model.items() if k != "module"}
    prefix = "bf16_" if loc.zero_files[0].name.startswith("bf16_") else ""
    return DeepSpeedMeta("zero", loc.tag_dir.name, len(loc.zero_files), groups, module, states, rest, optimizer,
                         tuple(param_groups), scalars, {k: top[k] for k in ("ds_config", "ds_version") if k in top}, prefix)  # fmt: skip


def _check_count(sd: dict, loc: Located) -> None:
    """Rank 0's `partition_count` is the DP world size: each of its rank files must be there."""
    count = sd.get("partition_count")
    dp = count[0] if isinstance(count, list) and count and isinstance(count[0], int) else None
    if dp is not None and dp > len(loc.zero_files):
        name = loc.zero_files[0].name.replace("zero_pp_rank_0_", f"zero_pp_rank_{len(loc.zero_files)}_")
        raise DeepSpeedError(f"{loc.tag_dir}: optimizer file of DP rank {len(loc.zero_files)} missing ({name}; "
                             f"partition_count says DP {dp}: a half-written save?)")  # fmt: skip


def _check_rank(sd: dict, meta: DeepSpeedMeta, flat: tuple, d: int, file: Path) -> None:
    if list(sd["partition_count"]) != [flat[0].dp] * len(flat):
        raise DeepSpeedError(f"{file}: key 'partition_count' is {sd['partition_count']}, but there are {flat[0].dp} DP rank files")
    align = sd.get("param_alignment_paddings")
    if align is not None and any(any(g) for g in align):
        raise DeepSpeedError(f"{file}: key 'param_alignment_paddings' is not all 0 (zero_optimization.parameter_alignment "
                             "on); tenplex reads the default unaligned flat layout only")  # fmt: skip
    paddings = sd.get("group_paddings")
    if paddings is not None and list(paddings) != [g.padding(d) for g in flat]:
        raise DeepSpeedError(f"{file}: key 'group_paddings' is {list(paddings)}, the layout of param_shapes at DP "
                             f"{flat[0].dp} gives {[g.padding(d) for g in flat]}")  # fmt: skip
    for g, (group, mapping) in enumerate(zip(flat, sd.get("param_slice_mappings") or [None] * len(flat))):
        want = [(f.name, f.stop - f.start, f.offset) for f in group.fragments(d)]
        got = None if mapping is None else [(str(n), getattr(a, 'numel', None), getattr(a, 'start', None)) for n, a in mapping.items()]
        if got is not None and got != want:
            raise DeepSpeedError(f"{file}: key 'param_slice_mappings[{g}]' is {got[:3]}..., the layout of param_shapes "
                                 f"gives {want[:3]}...")  # fmt: skip
        state = _group_state(sd, g, file)
        for k, v in meta.scalars[g].items():
            if k in state and not _same(state[k], v):
                raise DeepSpeedError(f"{file}: optimizer state {k!r} of param group {g} is {state[k]!r}, DP rank 0 has {v!r}")


def _group_state(sd: dict, g: int, file: Path) -> dict:
    base = sd["base_optimizer_state"]
    if isinstance(base, dict):
        state = base.get("state", {}).get(g)
    else:
        state = base[g] if g < len(base) else None
    return _dict(state, file, f"optimizer_state_dict/base_optimizer_state[{g}]")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _tensor(container: Any, key: Any, file: Path, where: str) -> np.ndarray:
    try:
        value = container[key]
    except (KeyError, IndexError, TypeError):
        raise DeepSpeedError(f"{file}: key '{where}[{key!r}]' missing") from None
    a = to_numpy(value, file, f"{where}[{key!r}]")
    if a.ndim != 1 or a.dtype != np.float32:
        raise DeepSpeedError(f"{file}: key '{where}[{key!r}]' is {a.dtype}{list(a.shape)}, expected a 1-D float32 partition")
    return a


def _universal(loc: Located, model: dict, groups: tuple, module: tuple, trust: bool) -> tuple[PTC, dict, dict, DeepSpeedMeta]:
    opt_file = loc.tag_dir / "zero" / "optimizer_state.pt"
    opt = _dict(load(opt_file, "universal optimizer state", trust_pickles=trust), opt_file)
    names = {n for g in groups for n, _ in g}
    if names != set(loc.params):
        odd = sorted(names ^ set(loc.params))[0]
        raise DeepSpeedError(f"{loc.tag_dir / 'zero'}: parameter {odd!r} is in only one of param_shapes and zero/")
    first = loc.tag_dir / "zero" / groups[0][0][0]
    states = tuple(sorted(p.stem for p in first.glob("*.pt") if p.stem not in (MASTER, "step")))
    arrays = _module_arrays(model, module, loc.model_file)
    scalars = []
    for group in groups:
        steps = {}
        for name, shape in group:
            for kind in (MASTER, *states):
                file = loc.tag_dir / "zero" / name / f"{kind}.pt"
                value = _dict(load(file, f"universal {kind} of {name}", trust_pickles=trust), file).get("param")
                a = to_numpy(value, file, "param")
                if a.shape != shape or a.dtype != np.float32:
                    raise DeepSpeedError(f"{file}: key 'param' is {a.dtype}{list(a.shape)}, expected float32{list(shape)} "
                                         "(tenplex reads universal checkpoints of one model-parallel rank)")  # fmt: skip
                arrays[f"dp0/{kind}/{name}"] = a.reshape(-1)
            step_file = loc.tag_dir / "zero" / name / "step.pt"
            if step_file.exists():
                steps[name] = load(step_file, f"universal step of {name}", trust_pickles=trust)
        values = list(steps.values())
        if any(not _same(v, values[0]) for v in values):
            raise DeepSpeedError(f"{loc.tag_dir / 'zero'}: the parameters of one param group disagree on 'step'")
        scalars.append({"step": values[0]} if values else {})
    param_groups = tuple({k: v for k, v in pg.items() if k != "params"} for pg in opt.get("param_groups", []))
    optimizer = {k: opt[k] for k in _OPT_SCALARS if k in opt}
    rest = {k: v for k, v in model.items() if k != "module"}
    top = {"ds_config": model.get("ds_config"), "ds_version": model.get("ds_version", opt.get("ds_version"))}
    bf16 = isinstance(top["ds_config"], dict) and bool((top["ds_config"].get("bf16") or {}).get("enabled"))
    meta = DeepSpeedMeta("universal", loc.tag_dir.name, 1, groups, module, states, rest, optimizer, param_groups,
                         tuple(scalars), top, "bf16_" if bf16 else "")  # fmt: skip
    return _result(_tp_meta(meta, [model], 1), arrays)
