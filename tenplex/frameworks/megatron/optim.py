"""Megatron's non-distributed optimizer state, bound to parameters by NAME (docs/conventions.md §4.1).

`model_optim_rng.pt['optimizer']` (a one-element list when saved through a ChainedOptimizer):
- fp16/bf16 (Float16OptimizerWithFloat16Params): `{'optimizer': {'state': {i: {'exp_avg',
  'exp_avg_sq'[, 'step']}}, 'param_groups': [{'params': [i...], ...}]}, 'fp32_from_fp16_params':
  [[fp32 master per group entry]], 'grad_scaler' (fp16 only)}`;
- fp32 (FP32Optimizer): the inner `{'state', 'param_groups'}` itself;
- distributed optimizer: `{'optimizer': {'param_groups': [groups without 'params']}, ...}`, the
  tensors being in distrib_optim.pt (`megatron.distrib`).

Binding: torch numbers a stage's parameters group by group. Megatron builds one group per class:
no weight decay for names ending in `.bias` and for 1-D parameters, weight decay otherwise. A
group's class is read from its `wd_mult` (0 = no decay); groups without `wd_mult` are the v2-era
pair `[decay, no decay]`. Within a group, parameters follow the model chunks in order, then
`named_parameters()` order (`Naming.order`). Group order is the order of first appearance
(megatron-core) unless the file shows another fixed order, which is then kept for every stage.

Invariants (CheckpointFormatError naming file and key): one group per class; group sizes equal
the stage's class counts; every index has Adam state of the parameter's TP-local shape; extra
per-parameter state (torch Adam's `step`) is equal for all parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.frameworks.megatron.tensors import to_numpy
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.frontends.params import Param

MOMENTS = ("exp_avg", "exp_avg_sq")


def no_decay(param: Param) -> bool:
    """Megatron's default: no weight decay for biases and 1-D parameters."""
    return param.key.endswith(".bias") or len(param.shape) == 1


def group_class(group: Mapping[str, Any], index: int, count: int) -> bool | None:
    """True for a no-weight-decay group, False for a decay group, None when unknown."""
    if "wd_mult" in group:
        return group["wd_mult"] == 0
    return bool(index) if count == 2 else None


def first_appearance(params: Sequence[Param]) -> tuple[bool, ...]:
    return tuple(dict.fromkeys(no_decay(p) for p in params))


@attrs.frozen
class Groups:
    """What a file says about its param groups: templates (group dict without `params`) by class,
    the observed class order, per-parameter state keys and extras, and the wrapper's scalars."""

    templates: tuple[tuple[bool, dict], ...]
    order: tuple[bool, ...]
    state_keys: tuple[str, ...] = MOMENTS
    extras: tuple[tuple[str, Any], ...] = ()
    scaler: tuple[tuple[str, Any], ...] | None = None
    chained: bool = False


def unwrap(value: Any, file: Path) -> tuple[dict, bool]:
    """(optimizer dict, saved as a one-element ChainedOptimizer list)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
        chained = True
    else:
        chained = False
    if not isinstance(value, dict):
        raise CheckpointFormatError(f"{file}: key 'optimizer' holds {type(value).__name__}, expected a dict")
    return value, chained


def inner(opt: dict, file: Path) -> tuple[dict, str]:
    """(the torch optimizer's state dict, its key path) of a wrapper dict."""
    if "state" in opt and "param_groups" in opt:
        return opt, "optimizer"
    node = opt.get("optimizer")
    if not isinstance(node, dict) or "param_groups" not in node:
        raise CheckpointFormatError(f"{file}: key 'optimizer/optimizer/param_groups' missing")
    return node, "optimizer/optimizer"


def classify(groups: Sequence[Mapping], file: Path, where: str) -> tuple[bool, ...]:
    classes = tuple(group_class(g, i, len(groups)) for i, g in enumerate(groups))
    for i, c in enumerate(classes):
        if c is None or classes.index(c) != i:
            raise CheckpointFormatError(
                f"{file}: key '{where}/param_groups/{i}' is not one weight-decay class per group "
                f"({len(groups)} groups; lr_mult or decoupled-lr groups are not supported)"
            )
    return classes  # type: ignore[return-value]


def bind(groups: Sequence[Mapping], params: Sequence[Param], file: Path, where: str) -> tuple[dict[int, Param], tuple[bool, ...]]:
    """Flat optimizer index -> parameter, and the group classes, for one stage's `params`."""
    classes = classify(groups, file, where)
    out: dict[int, Param] = {}
    for g, (group, c) in enumerate(zip(groups, classes)):
        members = [p for p in params if no_decay(p) == c]
        ids = list(group.get("params", ()))
        if len(ids) != len(members):
            raise CheckpointFormatError(
                f"{file}: key '{where}/param_groups/{g}/params' lists {len(ids)} parameters, but the stage has "
                f"{len(members)} {'no-' if c else ''}weight-decay parameters"
            )
        out.update(zip(ids, members))
    missing = [p.label for p in params if no_decay(p) not in classes]
    if missing:
        raise CheckpointFormatError(f"{file}: key '{where}/param_groups' has no group for parameter {missing[0]!r}")
    return out, classes


def _templates(groups: Sequence[Mapping], classes: Sequence[bool]) -> tuple[tuple[bool, dict], ...]:
    return tuple((c, {k: v for k, v in g.items() if k != "params"}) for g, c in zip(groups, classes))


def _extras(state: Mapping, file: Path, where: str) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    keys: tuple[str, ...] = MOMENTS
    extras: dict[str, Any] = {}
    for i, entry in state.items():
        keys = tuple(entry)
        for k, v in entry.items():
            if k in MOMENTS:
                continue
            if k in extras and not _same(extras[k], v):
                raise CheckpointFormatError(f"{file}: key '{where}/state/{i}/{k}' differs from other parameters'")
            extras.setdefault(k, v)
    return keys, tuple(extras.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


def read_adam(value: Any, params: Sequence[Param], shapes: Mapping[str, tuple[int, ...]], fp32_masters: bool,
              file: Path) -> tuple[dict[str, dict[str, np.ndarray]], Groups]:  # fmt: skip
    """{label: {kind: TP-local array}} and the group facts of one rank's non-distributed optimizer;
    `params` are the stage's parameters in optimizer order (chunks, then named_parameters()) and
    `shapes` their TP-local shapes.

    Raises:
        CheckpointFormatError: naming the file and the key that is missing or has the wrong shape.
    """
    opt, chained = unwrap(value, file)
    state_dict, where = inner(opt, file)
    groups = state_dict["param_groups"]
    by_index, classes = bind(groups, params, file, where)
    state = state_dict.get("state", {})
    out: dict[str, dict[str, np.ndarray]] = {}
    for i, p in by_index.items():
        entry = state.get(i)
        for kind in MOMENTS:
            if not isinstance(entry, Mapping) or kind not in entry:
                raise CheckpointFormatError(f"{file}: key '{where}/state/{i}/{kind}' missing (Adam state of {p.label!r})")
            out.setdefault(p.label, {})[kind] = _array(entry[kind], shapes[p.label], file, f"{where}/state/{i}/{kind}")
    if fp32_masters:
        _read_masters(opt, groups, by_index, shapes, out, file)
    keys, extras = _extras({i: state[i] for i in by_index}, file, where)
    scaler = opt.get("grad_scaler") if where != "optimizer" else None
    return out, Groups(_templates(groups, classes), classes, keys, extras,
                       None if scaler is None else tuple(scaler.items()), chained)  # fmt: skip


def _array(value: Any, shape: tuple[int, ...], file: Path, key: str) -> np.ndarray:
    a = to_numpy(value, file, key)
    if a.shape != shape or a.dtype != np.float32:
        raise CheckpointFormatError(f"{file}: key {key!r} is {a.dtype}{list(a.shape)}, expected float32{list(shape)}")
    return a


def _read_masters(opt: dict, groups: Sequence[Mapping], by_index: dict[int, Param], shapes: Mapping[str, tuple[int, ...]],
                  out: dict, file: Path) -> None:  # fmt: skip
    masters = opt.get("fp32_from_fp16_params")
    if not isinstance(masters, list) or len(masters) != len(groups):
        raise CheckpointFormatError(f"{file}: key 'optimizer/fp32_from_fp16_params' missing or not one list per group")
    for g, group in enumerate(groups):
        if len(masters[g]) != len(group["params"]):
            raise CheckpointFormatError(f"{file}: key 'optimizer/fp32_from_fp16_params/{g}' has {len(masters[g])} "
                                        f"masters for {len(group['params'])} parameters")  # fmt: skip
        for j, i in enumerate(group["params"]):
            key = f"optimizer/fp32_from_fp16_params/{g}/{j}"
            label = by_index[i].label
            out[label]["fp32_param"] = _array(masters[g][j], shapes[label], file, key)


def group_order(params: Sequence[Param], rule: tuple[bool, ...] | None) -> tuple[bool, ...]:
    """Class order of a stage's groups: `rule` (a fixed order) or first appearance when None."""
    if rule is not None:
        return rule
    return first_appearance(params)


def _groups(params: Sequence[Param], order: Sequence[bool], templates: Mapping[bool, dict]) -> list[tuple[dict, list[Param]]]:
    out = []
    for c in order:
        members = [p for p in params if no_decay(p) == c]
        if members or c in templates:
            if c not in templates:
                raise CheckpointFormatError(f"no source param group for {'no-' if c else ''}weight-decay parameters")
            out.append((dict(templates[c]), members))
    return out


def adam_state(params: Sequence[Param], tensors: Mapping[str, Mapping[str, torch.Tensor]], groups: Groups,
               rule: tuple[bool, ...] | None, fp16_wrapper: bool, scaler: Any) -> Any:  # fmt: skip
    """The `optimizer` value of one rank's file (non-distributed), from {label: {kind: tensor}}."""
    templates = dict(groups.templates)
    state: dict[int, dict] = {}
    param_groups, masters, index = [], [], 0
    for template, members in _groups(params, group_order(params, rule), templates):
        ids = list(range(index, index + len(members)))
        index += len(members)
        param_groups.append({**template, "params": ids})
        masters.append([tensors[p.label]["fp32_param"] for p in members] if fp16_wrapper else [])
        for i, p in zip(ids, members):
            entry = {**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in groups.extras}, **tensors[p.label]}
            state[i] = {k: entry[k] for k in groups.state_keys if k in entry}
    inner_dict = {"state": state, "param_groups": param_groups}
    if not fp16_wrapper:
        out: Any = inner_dict
    else:
        out = {"optimizer": inner_dict, **({"grad_scaler": scaler} if scaler is not None else {}),
               "fp32_from_fp16_params": masters}  # fmt: skip
    return [out] if groups.chained else out


def distrib_groups(value: Any, file: Path) -> Groups:
    """The group facts of a distributed optimizer's `optimizer` entry (groups without `params`).

    Raises:
        CheckpointFormatError: the entry has no param groups, or not one weight-decay class a group.
    """
    opt, chained = unwrap(value, file)
    state_dict, where = inner(opt, file)
    groups = state_dict["param_groups"]
    classes = classify(groups, file, where)
    scaler = opt.get("grad_scaler")
    return Groups(_templates(groups, classes), classes, MOMENTS, (),
                  None if scaler is None else tuple(scaler.items()), chained)  # fmt: skip


def distrib_state(params: Sequence[Param], groups: Groups, rule: tuple[bool, ...] | None, scaler: Any) -> Any:
    """The `optimizer` value of one rank's file with the distributed optimizer: param groups
    without `params` (plus the per-parameter `step` of a non-distributed source, as Megatron's
    DistributedOptimizer.state_dict adds it for torch's Adam)."""
    step = dict(groups.extras).get("step")
    param_groups = []
    for template, _ in _groups(params, group_order(params, rule), dict(groups.templates)):
        if step is not None and "step" not in template:
            template["step"] = step.item() if isinstance(step, torch.Tensor) else step
        param_groups.append(template)
    out = {"optimizer": {"param_groups": param_groups}, **({"grad_scaler": scaler} if scaler is not None else {})}
    return [out] if groups.chained else out
