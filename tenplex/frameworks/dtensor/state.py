"""DTensor state dicts ↔ PTC triples, without files: what a live job hands tenplex and gets back.

`ptc_from_state_dicts([sd_0, ..., sd_{W-1}])` takes one state dict per rank (element r is rank
r's) and returns `(PTC, {sub-tensor id: array}, {partition id: {name: value}})` in the layout of
`dtensor.layout`: partition `rank{r}`, sub-tensor `{fqn}@rank{r}`. A state dict is nested
dicts/lists as DCP flattens them (FQNs are DCP's: `optim.state.0.weight.exp_avg`, list indices
as components), with leaves:

- `DTensor` (Shard/Replicate on any mesh, sub-meshes included) or its torch-free description
  `LocalShard` (what `local_state` produces, so ranks can send their parts to one process);
- plain `torch.Tensor` / `numpy.ndarray`: replicated on every rank (as DCP assumes); unlike DCP,
  ranks that hold different data under one FQN are an error, not silent data loss (trap #20);
- anything else (ints, floats, strings, tuples, ...): a value (policy `replicated`); ranks must
  agree on it.

`state_dicts_from_arrays(ptc, arrays, values, mapping)` is the reverse for a dst layout: rank r's
nested state dict of local torch tensors (sharing memory with the arrays) and Python values,
ready to `copy_` into the new job's DTensors' local tensors.

Raises `PlacementError` (a SpecError) naming the FQN and rank for: unsupported placements
(`_StridedShard`, `Partial`), ranks that disagree on an FQN's layout or value, local tensors of
the wrong shape, partitions that are not `rank<r>`.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict
from torch.distributed.tensor import DTensor

from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate
from tenplex.frameworks.dtensor.convert import from_numpy, local_shard, to_numpy
from tenplex.frameworks.dtensor.layout import LocalShard, TensorSpec, ptc_from_specs, rank_of_partition, subtensor_id
from tenplex.frameworks.dtensor.values import python_value
from tenplex.ir.ptc import PTC

FqnMapping = dict[str, tuple[Any, ...]]  # DCP's flatten mapping: FQN -> nested key path


def flatten(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], FqnMapping]:
    """DCP's own flattening (FQN -> leaf, FQN -> key path), so FQNs match `.metadata`'s."""
    flat, mapping = flatten_state_dict(dict(state_dict))
    return flat, dict(mapping)


def local_state(state_dict: Mapping[str, Any], rank: int | None = None) -> dict[str, Any]:
    """A rank's flat state, torch-free and picklable: DTensors as `LocalShard`, plain tensors as
    numpy arrays (views), other leaves unchanged. `rank` defaults to this process's rank."""
    flat, _ = flatten(state_dict)
    out: dict[str, Any] = {}
    for fqn, leaf in flat.items():
        if isinstance(leaf, DTensor):
            out[fqn] = local_shard(leaf, fqn, rank)
        elif isinstance(leaf, torch.Tensor):
            out[fqn] = to_numpy(leaf)
        else:
            out[fqn] = leaf
    return out


def ptc_from_state_dicts(state_dicts: Sequence[Mapping[str, Any]]) -> tuple[PTC, dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """The PTC triple of one state dict per rank (see the module docstring)."""
    world = len(state_dicts)
    ranks = [local_state(sd, r) for r, sd in enumerate(state_dicts)]
    if world == 0:
        raise PlacementError("no state dicts: need one per rank")
    for r, flat in enumerate(ranks[1:], 1):
        if set(flat) != set(ranks[0]):
            diff = sorted(set(flat) ^ set(ranks[0]))
            raise PlacementError(f"rank {r} and rank 0 hold different FQNs: {diff[:5]}")
    specs, arrays, values = [], {}, {f"rank{r}": {} for r in range(world)}
    for fqn in sorted(ranks[0]):
        leaves = [flat[fqn] for flat in ranks]
        if isinstance(leaves[0], LocalShard):
            spec, got = _sharded(fqn, leaves)
        elif isinstance(leaves[0], np.ndarray):
            spec, got = _replicated(fqn, leaves)
        else:
            _same_values(fqn, leaves)
            for r, v in enumerate(leaves):
                values[f"rank{r}"][fqn] = v
            continue
        specs.append(spec)
        arrays.update(got)
    return ptc_from_specs(world, specs, sorted({n for vs in values.values() for n in vs})), arrays, values


def _sharded(fqn: str, leaves: list[Any]) -> tuple[TensorSpec, dict[str, np.ndarray]]:
    spec = leaves[0].spec(fqn)
    arrays = {}
    for r, leaf in enumerate(leaves):
        if not isinstance(leaf, LocalShard) or leaf.spec(fqn) != spec:
            raise PlacementError(f"{fqn}: rank {r} has layout {_describe(leaf, fqn)} but rank 0 has {_describe(leaves[0], fqn)}")
        if leaf.rank != r:
            raise PlacementError(f"{fqn}: the state dict at position {r} holds rank {leaf.rank}'s shard")
        box = spec.box_of_rank(r)
        if (leaf.array is None) != (box is None):
            raise PlacementError(f"{fqn}: rank {r} {'lacks' if leaf.array is None else 'has'} a local tensor but is {'in' if box else 'not in'} mesh ranks {list(spec.mesh_ranks)}")
        if leaf.array is not None:
            arrays[subtensor_id(fqn, r)] = leaf.array
    return spec, arrays


def _describe(leaf: Any, fqn: str) -> str:
    if not isinstance(leaf, LocalShard):
        return type(leaf).__name__
    s = leaf.spec(fqn)
    return f"{s.meta.dtype}{list(s.meta.shape)} on mesh {list(s.mesh_shape)} {[str(p) for p in s.placements]} ranks {list(s.mesh_ranks)}"


def _replicated(fqn: str, leaves: list[Any]) -> tuple[TensorSpec, dict[str, np.ndarray]]:
    a0 = leaves[0]
    for r, a in enumerate(leaves):
        if not isinstance(a, np.ndarray) or a.shape != a0.shape or a.dtype != a0.dtype or a.tobytes() != a0.tobytes():
            raise PlacementError(f"{fqn}: plain tensor differs between rank 0 and rank {r}; DCP would keep one copy and lose the other (save it as a DTensor or under distinct keys)")
    spec = LocalShard.on_mesh(a0, a0.shape, (len(leaves),), (Replicate(),), 0).spec(fqn)
    return spec, {subtensor_id(fqn, r): a for r, a in enumerate(leaves)}


def _same_values(fqn: str, leaves: list[Any]) -> None:
    for r, v in enumerate(leaves):
        if isinstance(v, (LocalShard, np.ndarray)) or not _equal(v, leaves[0]):
            raise PlacementError(f"{fqn}: rank {r} holds {v!r} but rank 0 holds {leaves[0]!r}; values must agree across ranks")


def _equal(a: Any, b: Any) -> bool:
    """Equal values: `==`, or the same pickle (NaN, objects without a usable `==`)."""
    if type(a) is not type(b):
        return False
    try:
        if bool(a == b):
            return True
    except Exception:  # noqa: BLE001 (an ambiguous or failing == falls back to pickles)
        pass
    try:
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:  # noqa: BLE001 (unpicklable and unequal)
        return False


def state_dicts_from_arrays(ptc: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]],
                            mapping: FqnMapping | None = None) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Rank -> that rank's state dict for the layout `ptc` (partitions `rank<r>`): local torch
    tensors keyed by sub-tensor path, values keyed by name (opaque DCP values decoded where
    `weights_only` loading allows), nested by `mapping` (DCP's flatten mapping) when given."""
    out: dict[int, dict[str, Any]] = {}
    for part in ptc.partitions:
        rank = rank_of_partition(part.id)
        flat: dict[str, Any] = {}
        for sid in part.subtensors:
            st = ptc.subtensor_map[sid]
            if sid not in arrays:
                raise PlacementError(f"rank {rank}: no array for sub-tensor {sid!r}")
            flat[st.path] = from_numpy(arrays[sid])
        for name, _ in part.values:
            flat[name] = python_value(values.get(part.id, {}).get(name))
        out[rank] = unflatten_state_dict(flat, {k: tuple(mapping.get(k, (k,))) for k in flat}) if mapping else flat
    return out
