"""The files of a pipeline (`PipelineModule`) checkpoint, read and written: the layer files, the
stages' param groups joined into global ones, and the stage boundaries (`pipe.py`).

Read: each `layer_{i:02d}-model_states.pt` is the layer's `state_dict`; its entry `k` becomes
module entry `{i}.{k}` (the parameter's name in `param_shapes`). The stages' param groups are
joined in stage order (group g of the whole model = group g of stage 0, then of stage 1, ...),
which is the order in which they are cut again for other stages. Written: every layer file
again (the layer files do not depend on the stage count), and per stage the model file with that
stage's `param_shapes`, `mp_world_size` and `checkpoint_parallel_dimensions.pp_degree`.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.frameworks.deepspeed.files import DeepSpeedError, Located, load, save
from tenplex.frameworks.deepspeed.meta import DeepSpeedMeta, pid
from tenplex.frameworks.deepspeed.pipe import layer_of, methods, partition
from tenplex.frameworks.megatron.tensors import dtype_name, to_numpy, torch_dtype


def join_groups(stage_groups: list[tuple], loc: Located) -> tuple:
    """The whole model's param groups: each group's stages' parameters, in stage order."""
    if len({len(g) for g in stage_groups}) > 1:
        raise DeepSpeedError(f"{loc.tag_dir}: the stages' model files have {[len(g) for g in stage_groups]} param groups; "
                             "tenplex reads pipelines whose stages have the same param groups")  # fmt: skip
    groups = tuple(tuple(p for stage in stage_groups for p in stage[g]) for g in range(len(stage_groups[0])))
    for n, _ in (p for g in groups for p in g):
        if layer_of(n) not in loc.layers:
            raise DeepSpeedError(f"{loc.tag_dir}: parameter {n!r} of param_shapes is not in a layer file "
                                 f"(layer_XX-model_states.pt); tied layers (TiedLayerSpec) are not read")  # fmt: skip
    return groups


def read_layers(loc: Located, trust: bool) -> tuple[tuple, dict[str, np.ndarray], tuple]:
    """(module entries, module key -> array, layers) of the layer files."""
    module, arrays, layers = [], {}, []
    for i in loc.layers:
        file = loc.layer_file(i)
        state = load(file, f"pipeline layer {i}", trust_pickles=trust)
        if not isinstance(state, dict):
            raise DeepSpeedError(f"{file}: holds {type(state).__name__}, expected the layer's state_dict")
        for k, v in state.items():
            if not isinstance(v, torch.Tensor):
                raise DeepSpeedError(f"{file}: key {k!r} holds {type(v).__name__}, expected a tensor")
            module.append((f"{i}.{k}", dtype_name(v, file, str(k)), tuple(v.shape)))
            arrays[f"{i}.{k}"] = to_numpy(v, file, str(k))
        layers.append((i, tuple(str(k) for k in state)))
    return tuple(module), arrays, tuple(layers)


def pp_meta(meta: DeepSpeedMeta, models: list[dict], layers: tuple, stage_groups: list[tuple]) -> DeepSpeedMeta:
    """`meta` with the pipeline's layers, stage boundaries and the partition methods that fit them."""
    stage_layers = [{layer_of(n) for g in sg for n, _ in g} for sg in stage_groups]
    meta = attrs.evolve(meta, layers=layers, tp=1, why_fixed="a pipeline checkpoint keeps TP 1",
                        other_states=tuple({k: v for k, v in m.items() if k != "module"} for m in models[1:]))  # fmt: skip
    fits = methods(weights(meta), stage_layers)
    if fits:
        parts = tuple(partition(fits[0], weights(meta), len(stage_layers)))
    else:  # boundaries that hold each stage's layers (a layer without parameters goes to the later stage)
        parts = (0, *(min(s, default=0) for s in stage_layers[1:]), len(weights(meta)))
    return attrs.evolve(meta, parts=parts, pp_methods=fits)


def weights(meta: DeepSpeedMeta) -> list[int]:
    """Trainable elements per layer (DeepSpeed's 'parameters' weights), for every layer index."""
    out = [0] * (max((i for i, _ in meta.layers), default=-1) + 1)
    for g in meta.groups:
        for n, s in g:
            out[layer_of(n)] += int(np.prod(s))
    return out


def parts_for(meta: DeepSpeedMeta, pp: int) -> tuple[int, ...]:
    """The stage boundaries for `pp` stages, as DeepSpeed computes them for the source's model."""
    if pp == meta.pp:
        return meta.parts
    if not meta.pp_methods:
        raise DeepSpeedError(f"{meta.tag}: cannot change PP {meta.pp} -> {pp}: neither of DeepSpeed's partition methods "
                             f"('parameters', 'uniform') gives the source's stages {list(meta.parts)}")  # fmt: skip
    found = {m: tuple(partition(m, weights(meta), pp)) for m in meta.pp_methods}
    if len(set(found.values())) > 1:
        raise DeepSpeedError(f"{meta.tag}: cannot change PP {meta.pp} -> {pp}: the source's stages fit both of DeepSpeed's "
                             f"partition methods, which split {len(weights(meta))} layers into {pp} stages differently "
                             f"({', '.join(f'{m}: {list(p)}' for m, p in found.items())})")  # fmt: skip
    parts = next(iter(found.values()))
    if any(parts[s] == parts[s + 1] for s in range(pp)) or any(
        not any(g) for s in range(pp) for g in meta.groups_of(s, parts)
    ):
        raise DeepSpeedError(f"{meta.tag}: cannot change PP {meta.pp} -> {pp}: stages {list(parts)} leave a stage without "
                             "layers or a param group empty")  # fmt: skip
    return parts


def write_layers(meta: DeepSpeedMeta, fill: Any, tag_dir: Path, parts: tuple[int, ...]) -> None:
    """Every layer file, each entry filled from the stage that holds it."""
    n = len(parts) - 1
    dtypes = {k: (d, s) for k, d, s in meta.module}
    for i, keys in meta.layers:
        state = collections.OrderedDict()
        stage = next(s for s in range(n) if parts[s] <= i < parts[s + 1])
        for k in keys:
            dtype, shape = dtypes[f"{i}.{k}"]
            state[k] = torch.empty(shape, dtype=torch_dtype(dtype))
            fill(f"{pid(stage, 0, n)}/module/{i}.{k}", to_numpy(state[k], Path("<layer>"), k))
        save(state, tag_dir / f"layer_{i:02d}-model_states.pt")


def stage_states(meta: DeepSpeedMeta, m: int, parts: tuple[int, ...]) -> dict[str, Any]:
    """Stage m's model file without `module`: its own at the source's stages, else stage 0's with
    the new stage's `param_shapes` and the new stage count."""
    if parts == meta.parts:
        return meta.model_states if m == 0 else meta.other_states[m - 1]
    states = dict(meta.model_states, mp_world_size=len(parts) - 1)
    states["param_shapes"] = [
        collections.OrderedDict((n, torch.Size(s)) for n, s in g) for g in meta.groups_of(m, parts)
    ]
    dims = states.get("checkpoint_parallel_dimensions")
    if isinstance(dims, dict):
        states["checkpoint_parallel_dimensions"] = {**dims, "pp_degree": len(parts) - 1}
    return states
