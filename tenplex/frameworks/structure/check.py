"""Check one rank file of a structure against the PTC's shapes, tensor by tensor.

Every tensor leaf of the file must be accounted for:
- `model` (or `model0`, ...): the stage's parameters under the file's naming, each of its
  TP-local shape; mcore `_extra_state` entries may hold anything;
- `optimizer`: Adam `exp_avg`/`exp_avg_sq` of state index i, bound to a parameter BY NAME
  (`megatron.optim.bind`: weight-decay class per group, then `named_parameters()` order), of
  that parameter's TP-local shape; `fp32_from_fp16_params[g][j]` of the j-th parameter of group g
  (fp16/bf16); `grad_scaler/scale` ([1]) and per-parameter `step` are state without a PTC tensor;
- any key path with "rng" in a key (RNG states: re-derived per rank, not carried).

The reference instead binds index i through model_keys.json's order split into [weight decay,
no weight decay] (docs/reference-tenplex.md §3.5); where that gives another parameter, `order_note` says so.

Invariants: a tensor leaf not accounted for, a missing parameter or state entry, or a shape
other than the PTC's raises StructureError naming the file, the key path and both shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.names import Naming, extra_module, is_chunk_key
from tenplex.frameworks.megatron.optim import MOMENTS, bind, inner, unwrap
from tenplex.frameworks.structure.files import (
    Path_,
    StructureError,
    as_structure_error,
    flat_leaves,
    key_str,
    tensor_leaves,
    tensor_shape,
)
from tenplex.frontends.layout import shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tenplex.frontends.params import Param
from tenplex.frontends.transformer import Stage


@attrs.frozen(eq=False)
class Rank:
    """One rank file to check: where it is and what the PTC says it holds."""

    file: Path
    data: Any
    stage: Stage
    pp: int
    tp: int


@attrs.frozen(eq=False)
class Checker:
    """The layout every rank file is checked against."""

    model: ModelSpec
    parallel: ParallelConfig
    naming: Naming

    def local(self, param: Param, tp: int) -> tuple[int, ...]:
        return shard(param.shape, param.rule, self.parallel.tp, tp, self.model.make_vocab_size_divisible_by).shape

    def check(self, rank: Rank) -> dict[int, Param]:
        """Check every tensor of `rank`; the optimizer index -> parameter binding ({} without).

        Raises:
            StructureError: naming the file and the key path that does not match.
        """
        if not isinstance(rank.data, dict):
            raise StructureError(f"{rank.file}: holds {type(rank.data).__name__}, expected a checkpoint object")
        claims = _Claims(rank.file, self.parallel.tp)
        self._model(rank, claims)
        by_index = self._optimizer(rank, claims) if self.model.has_optimizer else {}
        for path, shape in tensor_leaves(rank.data, rank.file):
            if path not in claims.paths and not any(isinstance(p, str) and "rng" in p for p in path):
                raise StructureError(f"{rank.file}: unknown key '{key_str(path)}' (a tensor {list(shape)} the "
                                     f"{self.model.kind} PTC does not hold for pp={rank.pp}, tp={rank.tp})")  # fmt: skip
        return by_index

    def _model(self, rank: Rank, claims: _Claims) -> None:
        file, data = rank.file, rank.data
        want, got = {c.prefix for c, _ in rank.stage}, {k for k in data if is_chunk_key(k)}
        for key in sorted(want ^ got):
            raise StructureError(f"{file}: key '{key}' " + ("missing" if key in want else "unexpected for this layout"))
        for chunk, params in rank.stage:
            if not isinstance(data[chunk.prefix], dict):
                raise StructureError(f"{file}: key '{chunk.prefix}' is not an object")
            flat = flat_leaves(data[chunk.prefix], file, (chunk.prefix,))
            wanted = {self.naming.key(p.key): p for p in params}
            for key, node in flat.items():
                path = (chunk.prefix, *key.split("/"))
                param = wanted.get(key)
                if param is not None:
                    claims.tensor(node, path, self.local(param, rank.tp), f"parameter {param.label}")
                elif self.naming.family == "mcore" and extra_module(key) is not None:
                    claims.paths.add(path)
                else:
                    raise StructureError(f"{file}: unknown key '{key_str(path)}' (no parameter of the "
                                         f"{self.model.kind} model on pp={rank.pp})")  # fmt: skip
            for key in wanted.keys() - flat.keys():
                raise StructureError(f"{file}: key '{chunk.prefix}/{key}' missing (parameter {wanted[key].label})")

    def _optimizer(self, rank: Rank, claims: _Claims) -> dict[int, Param]:
        file = rank.file
        if "optimizer" not in rank.data:
            raise StructureError(f"{file}: key 'optimizer' missing (rank pp=0, tp=0 has optimizer state)")
        with as_structure_error():
            opt, chained = unwrap(rank.data["optimizer"], file)
            state_dict, where = inner(opt, file)
        base: Path_ = ("optimizer", 0) if chained else ("optimizer",)
        sd_path: Path_ = base + (("optimizer",) if where != "optimizer" else ())
        groups = _groups(state_dict, file, sd_path)
        ordered = [p for _, params in rank.stage for p in self.naming.order(params)]
        with as_structure_error():
            by_index, _ = bind(groups, ordered, file, key_str(sd_path))
        shapes = {p.label: self.local(p, rank.tp) for p in ordered}
        self._state(state_dict.get("state", {}), by_index, shapes, claims, sd_path)
        if self.model.dtype != "float32":
            _masters(opt, groups, by_index, shapes, claims, base)
            scaler = opt.get("grad_scaler")
            if isinstance(scaler, dict) and "scale" in scaler:
                claims.tensor(scaler["scale"], (*base, "grad_scaler", "scale"), None, "the loss scale")
        return by_index

    def _state(self, state: Any, by_index: Mapping[int, Param], shapes: Mapping[str, tuple[int, ...]],
               claims: _Claims, where: Path_) -> None:  # fmt: skip
        file = claims.file
        if not isinstance(state, dict):
            raise StructureError(f"{file}: key '{key_str((*where, 'state'))}' is not an object")
        for k in state:
            if not str(k).isdigit() or int(k) not in by_index:
                raise StructureError(f"{file}: unknown key '{key_str((*where, 'state', k))}' (the param groups "
                                     f"number {len(by_index)} parameters, 0..{len(by_index) - 1})")  # fmt: skip
        for i, p in sorted(by_index.items()):
            entry, path = state.get(str(i)), (*where, "state", str(i))
            if not isinstance(entry, dict):
                raise StructureError(f"{file}: key '{key_str(path)}' missing (Adam state of {p.label})")
            for kind in MOMENTS:
                if kind not in entry:
                    raise StructureError(f"{file}: key '{key_str((*path, kind))}' missing (Adam {kind} of {p.label})")
                claims.tensor(entry[kind], (*path, kind), shapes[p.label], f"Adam {kind} of {p.label}")
            for k in entry.keys() - set(MOMENTS):
                if k != "step":
                    raise StructureError(f"{file}: unknown key '{key_str((*path, k))}' (Adam keeps exp_avg, "
                                         f"exp_avg_sq and step)")  # fmt: skip
                if tensor_shape(entry[k], file, (*path, k)) is not None:
                    claims.tensor(entry[k], (*path, k), None, "Adam step")


def _groups(state_dict: dict, file: Path, where: Path_) -> list[dict]:
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise StructureError(f"{file}: key '{key_str((*where, 'param_groups'))}' is not a list of objects")
    for g, group in enumerate(groups):
        ids = group.get("params")
        if ids is None:
            raise StructureError(f"{file}: key '{key_str((*where, 'param_groups', g))}' has no 'params': the distributed "
                                 f"optimizer keeps its state in distrib_optim.pt, which structures do not describe")  # fmt: skip
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise StructureError(
                f"{file}: key '{key_str((*where, 'param_groups', g, 'params'))}' is not a list of indices"
            )
    return groups


def _masters(opt: dict, groups: list[dict], by_index: Mapping[int, Param], shapes: Mapping[str, tuple[int, ...]],
             claims: _Claims, base: Path_) -> None:  # fmt: skip
    path = (*base, "fp32_from_fp16_params")
    masters = opt.get("fp32_from_fp16_params")
    if not isinstance(masters, list) or len(masters) != len(groups):
        raise StructureError(f"{claims.file}: key '{key_str(path)}' missing or not one list per param group "
                             f"({len(groups)} groups; 16-bit parameters keep fp32 master copies)")  # fmt: skip
    for g, group in enumerate(groups):
        if not isinstance(masters[g], list) or len(masters[g]) != len(group["params"]):
            size = len(masters[g]) if isinstance(masters[g], list) else type(masters[g]).__name__
            raise StructureError(f"{claims.file}: key '{key_str((*path, g))}' holds {size} master copies for "
                                 f"{len(group['params'])} parameters")  # fmt: skip
        for j, i in enumerate(group["params"]):
            label = by_index[i].label
            claims.tensor(masters[g][j], (*path, g, j), shapes[label], f"fp32 master of {label}")


class _Claims:
    """The tensor key paths of one file that the checks accounted for."""

    def __init__(self, file: Path, tp: int):
        self.file, self.tp = file, tp
        self.paths: set[Path_] = set()

    def tensor(self, node: Any, path: Path_, want: tuple[int, ...] | None, what: str) -> None:
        """Claim the tensor at `path`; its shape must be `want` (None: any shape)."""
        shape = tensor_shape(node, self.file, path)
        if shape is None:
            raise StructureError(
                f"{self.file}: key '{key_str(path)}' is {str(node)[:60]!r}, expected a tensor ({what})"
            )
        if want is not None and shape != want:
            raise StructureError(f"{self.file}: key '{key_str(path)}' has shape {list(shape)}, expected "
                                 f"{list(want)} ({what}, tp={self.tp})")  # fmt: skip
        self.paths.add(path)


def order_note(rank: Rank, naming: Naming, by_index: Mapping[int, Param], keys: list[list[Any]]) -> str | None:
    """Where model_keys.json's order, split [weight decay, no weight decay] as the reference does,
    binds optimizer indices to other parameters than binding by name: a short account of the
    first such index, or None when both agree."""
    shapes = dict(tensor_leaves(rank.data, rank.file))
    no_wd = [any("bias" in str(e) for e in k) or len(shapes[tuple(k)]) == 1 for k in keys]
    by_order = [tuple(k) for k, n in zip(keys, no_wd) if not n] + [tuple(k) for k, n in zip(keys, no_wd) if n]
    prefix = {p.label: c.prefix for c, params in rank.stage for p in params}
    by_name = {i: (prefix[p.label], *naming.key(p.key).split("/")) for i, p in by_index.items()}
    wrong = [i for i in sorted(by_name) if i >= len(by_order) or by_order[i] != by_name[i]]
    if not wrong:
        return None
    i = wrong[0]
    other = key_str(by_order[i]) if i < len(by_order) else "nothing"
    return (f"{rank.file.parent.name}: {len(wrong)} of {len(by_name)} indices, e.g. state/{i} is "
            f"{key_str(by_name[i])} by name, {other} by key order")  # fmt: skip
