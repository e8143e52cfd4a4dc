"""`build_tree`: a Megatron-LM legacy checkpoint tree on disk, as Megatron's save_checkpoint writes
it (conventions §1.3-1.4, §4.1-4.2), from `megatron_builder`'s independent statement of the rules."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tests.frameworks.megatron_builder import TORCH, Builder, bucket_world, chunk_layers, make_args, rng_state, split

LOCAL_EXTRA = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")


@attrs.frozen(eq=False)
class Built:
    root: Path
    model: ModelSpec
    parallel: ParallelConfig
    truth: dict[str, np.ndarray]  # frontend global tensor name -> full tensor (masters, moments too)


@attrs.frozen
class Options:
    naming: str = "legacy"  # legacy | mcore | mcore-te
    iteration: int = 100
    release: bool = False
    version: float = 3.0
    optimizer: bool = True
    group_rule: str = "first"  # first (megatron-core) | v2 (fixed [decay, no decay], no wd_mult)
    pad_value: float = 0.0
    chained: bool = False
    seed: int = 0
    args: tuple[tuple[str, Any], ...] = ()


def build_tree(root: Path, model: ModelSpec, par: ParallelConfig, **options: Any) -> Built:
    """Write the checkpoint of a random `model` trained with `par` (dp given) under `root`."""
    opt = Options(**{k: tuple(v.items()) if k == "args" else v for k, v in options.items()})
    b = Builder(model, opt.seed, opt.pad_value)
    layers = chunk_layers(model, par)
    step = root / ("release" if opt.release else f"iter_{opt.iteration:07d}")
    for pp in range(par.pp):
        chunks = [b.params(par, pp, vp, layers[pp, vp], opt.naming) for vp in range(par.vpp)]
        for tp in range(par.tp):
            args = make_args(model, par, pp, tp, **dict(opt.args))
            rank = step / (f"mp_rank_{tp:02d}" if par.pp == 1 else f"mp_rank_{tp:02d}_{pp:03d}")
            rank.mkdir(parents=True)
            state: dict[str, Any] = {"args": args, "checkpoint_version": opt.version, "iteration": opt.iteration}
            for vp, params in enumerate(chunks):
                last = (pp, vp) == (par.pp - 1, par.vpp - 1)
                state["model" if par.vpp == 1 else f"model{vp}"] = model_dict(b, params, par, tp, opt, last)
            if opt.optimizer:
                flat = [p for params in chunks for p in params]
                state["optimizer"] = optimizer(b, flat, par, tp, opt)
                state["opt_param_scheduler"] = {"max_lr": 3e-4, "min_lr": 3e-5, "num_steps": opt.iteration * 16,
                                                "lr_decay_style": "cosine", "start_wd": 0.1, "end_wd": 0.1}  # fmt: skip
                if par.zero:
                    torch.save(distrib(b, chunks, par, pp, tp, args, opt), rank / "distrib_optim.pt")
            state["rng_state"] = rng_state(1234, pp, tp, draws=3)
            state["num_floating_point_operations_so_far"] = 1.5e15
            torch.save(state, rank / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("release" if opt.release else str(opt.iteration))
    return Built(root, model, par, b.truth)


def padded(m: ModelSpec, tp: int) -> int:
    step = m.make_vocab_size_divisible_by * tp
    return -(-m.vocab // step) * step


def local(b: Builder, p: dict, par: ParallelConfig, tp: int, kind: str, opt: Options) -> torch.Tensor:
    t = split(b.full(p["name"], p["shape"])[kind], p["rule"], par.tp, tp, padded(b.m, par.tp))
    if p["rule"] == "vocab" and opt.pad_value:
        rows = padded(b.m, par.tp) // par.tp
        for r in range(rows):
            if tp * rows + r >= b.m.vocab:
                t[r] = opt.pad_value
    if opt.version < 2 and ".query_key_value." in p["key"]:
        heads, hn = b.m.heads // par.tp, b.m.head_dim
        grouped = t.reshape(heads, 3, hn, *t.shape[1:])
        t = (grouped.transpose(0, 1) if opt.version == 0 else grouped.transpose(1, 2)).reshape(t.shape).clone()
    return t.contiguous()


def model_dict(b: Builder, params: list[dict], par: ParallelConfig, tp: int, opt: Options, last: bool) -> dict:
    if opt.naming == "legacy":
        out: dict = {}
        for p in params:
            *parents, leaf = p["key"].split("/")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = local(b, p, par, tp, "weight", opt)
        return out
    extra = set(LOCAL_EXTRA) | ({"self_attention.core_attention"} if opt.naming == "mcore-te" else set())
    flat: dict[str, Any] = {}
    previous = None
    for p in params + [None]:
        module = _module(p["key"]) if p is not None else None
        if module != previous and previous is not None and previous.split(".", 3)[-1] in extra:
            flat[f"{previous}._extra_state"] = None
        if p is not None and module != previous and module.endswith("self_attention.linear_proj") and opt.naming == "mcore-te":
            flat[module.replace("linear_proj", "core_attention") + "._extra_state"] = None
        if p is not None:
            flat[p["key"]] = local(b, p, par, tp, "weight", opt)
        previous = module
    if last:
        flat["output_layer._extra_state"] = None
    return flat


def _module(key: str) -> str:
    return key.rsplit(".", 1)[0]


def _no_decay(p: dict) -> bool:
    return p["key"].endswith(".bias") or len(p["shape"]) == 1


def _group(no_wd: bool, opt: Options) -> dict:
    group = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0 if no_wd else 0.1, "amsgrad": False,
             "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None}  # fmt: skip
    if opt.group_rule == "first":
        group = {"wd_mult": 0.0 if no_wd else 1.0, "lr_mult": 1.0, "is_expert_parallel": False,
                 "is_decoupled_lr": False, **group}  # fmt: skip
    return group


def _classes(flat: list[dict], opt: Options) -> list[bool]:
    if opt.group_rule == "v2":
        return [False, True]
    return list(dict.fromkeys(_no_decay(p) for p in flat))


def optimizer(b: Builder, flat: list[dict], par: ParallelConfig, tp: int, opt: Options) -> Any:
    scaler = {"scale": torch.tensor([65536.0]), "growth_tracker": 7, "hysteresis_tracker": 2} if b.m.dtype == "float16" else None
    if par.zero:
        groups = [{**_group(c, opt), "step": float(opt.iteration)} for c in _classes(flat, opt)]
        out: Any = {"optimizer": {"param_groups": groups}, **({"grad_scaler": scaler} if scaler else {})}
        return [out] if opt.chained else out
    state, groups, masters, index = {}, [], [], 0
    for c in _classes(flat, opt):
        members = [p for p in flat if _no_decay(p) == c]
        groups.append({**_group(c, opt), "params": list(range(index, index + len(members)))})
        masters.append([local(b, p, par, tp, "param", opt) for p in members])
        for p in members:
            state[index] = {"step": torch.tensor(float(opt.iteration)),
                            **{k: local(b, p, par, tp, k, opt) for k in ("exp_avg", "exp_avg_sq")}}  # fmt: skip
            index += 1
    inner = {"state": state, "param_groups": groups}
    if b.m.dtype == "float32":
        out = inner
    else:
        out = {"optimizer": inner, **({"grad_scaler": scaler} if scaler else {}), "fp32_from_fp16_params": masters}
    return [out] if opt.chained else out


def distrib(b: Builder, chunks: list[list[dict]], par: ParallelConfig, pp: int, tp: int, args: Any, opt: Options) -> dict:
    out: dict[Any, Any] = {"buckets_coalesced": True}
    for g, params in enumerate(chunks):
        numels = {p["key"]: math.prod(local(b, p, par, tp, "param", opt).shape) for p in params}
        size = None
        if args.overlap_grad_reduce and pp == 0 and g == 0:
            size = args.ddp_bucket_size or max(40_000_000, 1_000_000 * par.dp)
        world, total = bucket_world(params, numels, par.dp, size)
        tensors: dict[str, Any] = {}
        for key, kind in (("param", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            buf = torch.zeros(total, dtype=torch.float32)
            for p in params:
                start, stop = world[p["key"]]
                buf[start:stop] = local(b, p, par, tp, kind, opt).reshape(-1)
            tensors[key] = buf
        tensors["numel_unpadded"] = total
        out[g] = {(TORCH[b.m.dtype], torch.float32): tensors}
    return out
