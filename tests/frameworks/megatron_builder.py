"""Builds Megatron-LM legacy checkpoint trees with random weights, as Megatron writes them.

Written from Megatron's rules directly (torch.chunk per TP rule, SwiGLU halves chunked apart,
vocab padded then chunked, the legacy nested / mcore flat state dicts, Float16Optimizer and
DistributedOptimizer state, the `_ParamAndGradBuffer` bucket loop), not through tenplex's own
layout code, so that reading a built tree checks tenplex against an independent statement of the
format. `build` returns the full (unsharded) tensors under the frontend's global names.
"""

from __future__ import annotations

import argparse
import math
import random
import struct
from typing import Any

import numpy as np
import torch

from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig

LEGACY = {"input_norm": "input_norm", "self_attention.linear_qkv": "self_attention.query_key_value",
          "self_attention.linear_proj": "self_attention.dense", "pre_mlp_norm": "post_attention_norm",
          "mlp.fc1": "mlp.dense_h_to_4h", "mlp.fc2": "mlp.dense_4h_to_h"}  # fmt: skip
MCORE = {"input_norm": "input_layernorm", "self_attention.linear_qkv": "self_attention.linear_qkv",
         "self_attention.linear_proj": "self_attention.linear_proj", "pre_mlp_norm": "pre_mlp_layernorm",
         "mlp.fc1": "mlp.linear_fc1", "mlp.fc2": "mlp.linear_fc2"}  # fmt: skip
# mcore module order inside a layer (Attention registers linear_proj before SelfAttention's linear_qkv)
MCORE_ORDER = ["input_norm", "self_attention.linear_proj", "self_attention.linear_qkv", "pre_mlp_norm", "mlp.fc1", "mlp.fc2"]
LEGACY_ORDER = ["input_norm", "self_attention.linear_qkv", "self_attention.linear_proj", "pre_mlp_norm", "mlp.fc1", "mlp.fc2"]
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def layer_params(m: ModelSpec) -> list[tuple[str, str, list[int], str]]:
    """(module, leaf, full shape, TP rule) of one layer, legacy order."""
    h, rows = m.hidden, (m.heads + 2 * m.query_groups) * m.head_dim
    fc1 = 2 * m.ffn_hidden if m.glu else m.ffn_hidden
    out = []
    for module, shape, rule, bias_rule in (
        ("input_norm", [h], "rep", "rep"), ("self_attention.linear_qkv", [rows, h], "col", "col"),
        ("self_attention.linear_proj", [h, m.heads * m.head_dim], "row", "rep"), ("pre_mlp_norm", [h], "rep", "rep"),
        ("mlp.fc1", [fc1, h], "glu" if m.glu else "col", "glu" if m.glu else "col"),
        ("mlp.fc2", [h, m.ffn_hidden], "row", "rep"),
    ):  # fmt: skip
        norm = module.endswith("norm")
        out.append((module, "weight", shape, rule))
        if (m.norm == "layernorm") if norm else m.bias_linear:
            out.append((module, "bias", shape[:1], bias_rule))
    return out


def split(full: torch.Tensor, rule: str, tp: int, r: int, vp: int) -> torch.Tensor:
    if rule == "rep":
        return full.clone()
    if rule == "vocab":
        padded = torch.zeros((vp,) + tuple(full.shape[1:]), dtype=full.dtype)
        padded[: full.shape[0]] = full
        return torch.chunk(padded, tp, 0)[r].clone()
    if rule == "glu":
        w, v = torch.chunk(full, 2, 0)
        return torch.cat([torch.chunk(w, tp, 0)[r], torch.chunk(v, tp, 0)[r]]).clone()
    return torch.chunk(full, tp, 1 if rule == "row" else 0)[r].clone()


def chunk_layers(m: ModelSpec, par: ParallelConfig) -> dict[tuple[int, int], range]:
    L, p, v = m.num_layers, par.pp, par.vpp
    if v > 1:
        n = L // (p * v)
        return {(pp, vp): range(vp * L // v + pp * n, vp * L // v + (pp + 1) * n) for pp in range(p) for vp in range(v)}
    counts = [L // p] * p
    if par.first is not None or par.last is not None:
        ends = [x for x in (par.first, par.last) if x is not None]
        share = (L - sum(ends)) // (p - len(ends)) if p > len(ends) else 0
        counts = [share] * p
        counts[0] = par.first if par.first is not None else counts[0]
        counts[-1] = par.last if par.last is not None else counts[-1]
    starts = np.cumsum([0] + counts)
    return {(pp, 0): range(starts[pp], starts[pp + 1]) for pp in range(p)}


class Builder:
    """Random full tensors for one model, cut into the rank files of one layout."""

    def __init__(self, m: ModelSpec, seed: int = 0, pad_value: float = 0.0):
        self.m, self.gen, self.pad_value = m, torch.Generator().manual_seed(seed), pad_value
        self.truth: dict[str, np.ndarray] = {}

    def full(self, name: str, shape: list[int]) -> dict[str, torch.Tensor]:
        """{kind: full tensor} of a parameter (created once): fp32 master, weight, moments."""
        if name not in self.truth:
            master = torch.randn(shape, generator=self.gen) * 0.02
            self.truth[f"optim.fp32_param/{name}"] = master.numpy()
            self.truth[name] = _np(master.to(TORCH[self.m.dtype]))
            for kind in ("exp_avg", "exp_avg_sq"):
                self.truth[f"optim.{kind}/{name}"] = (torch.rand(shape, generator=self.gen) + 0.5).numpy()
        if self.m.dtype == "float32":
            self.truth[f"optim.fp32_param/{name}"] = self.truth[name]
        return {"param": torch.from_numpy(self.truth[f"optim.fp32_param/{name}"]),
                "weight": _torch(self.truth[name], self.m.dtype),
                **{k: torch.from_numpy(self.truth[f"optim.{k}/{name}"]) for k in ("exp_avg", "exp_avg_sq")}}  # fmt: skip

    def params(self, par: ParallelConfig, pp: int, vp: int, layers: range, naming: str) -> list[dict]:
        """One chunk's parameters in named_parameters() order: name, key, shape, rule, shared."""
        m, first, last = self.m, (pp, vp) == (0, 0), (pp, vp) == (par.pp - 1, par.vpp - 1)
        mc, te = naming.startswith("mcore"), naming == "mcore-te"
        out = []
        if first:
            out.append(_p("embedding.word_embeddings.weight", "embedding.word_embeddings.weight" if mc else
                          "language_model/embedding/word_embeddings/weight", [m.vocab, m.hidden], "vocab",
                          m.tied_embeddings and par.pp > 1))  # fmt: skip
            if m.max_position:
                out.append(_p("embedding.position_embeddings.weight", "embedding.position_embeddings.weight" if mc
                              else "language_model/embedding/position_embeddings/weight", [m.max_position, m.hidden], "rep"))  # fmt: skip
        for j, i in enumerate(layers):
            table = {(mod, leaf): (shape, rule) for mod, leaf, shape, rule in layer_params(m)}
            for mod in MCORE_ORDER if mc else LEGACY_ORDER:
                for leaf in ("weight", "bias"):
                    if (mod, leaf) in table:
                        out.append(_p(f"layers.{i}.{mod}.{leaf}", _layer_key(mod, leaf, j, mc, te), *table[mod, leaf]))
            if te:  # fused norms sit first inside linear_qkv / linear_fc1
                out = _te_order(out, i)
        if last:
            for leaf in ("weight", "bias")[: 2 if m.norm == "layernorm" else 1]:
                out.append(_p(f"final_norm.{leaf}", f"decoder.final_layernorm.{leaf}" if mc else
                              f"language_model/encoder/final_norm.{leaf}", [m.hidden], "rep"))  # fmt: skip
            if not m.tied_embeddings:
                out.append(_p("output_layer.weight", "output_layer.weight" if mc else
                              "language_model/output_layer/weight", [m.vocab, m.hidden], "vocab"))  # fmt: skip
            elif par.pp > 1:
                out.append(_p("embedding.word_embeddings.weight", "output_layer.weight" if mc else
                              "word_embeddings_for_head/weight", [m.vocab, m.hidden], "vocab", True))  # fmt: skip
        return out


def _p(name: str, key: str, shape: list[int], rule: str, shared: bool = False) -> dict:
    return {"name": name, "key": key, "shape": shape, "rule": rule, "shared": shared}


def _layer_key(mod: str, leaf: str, j: int, mc: bool, te: bool) -> str:
    if not mc:
        return f"language_model/encoder/layers.{j}.{LEGACY[mod]}.{leaf}"
    if te and mod in ("input_norm", "pre_mlp_norm"):
        fused = "self_attention.linear_qkv" if mod == "input_norm" else "mlp.linear_fc1"
        return f"decoder.layers.{j}.{fused}.layer_norm_{leaf}"
    return f"decoder.layers.{j}.{MCORE[mod]}.{leaf}"


def _te_order(params: list[dict], layer: int) -> list[dict]:
    head = [p for p in params if not p["name"].startswith(f"layers.{layer}.")]
    mine = [p for p in params if p["name"].startswith(f"layers.{layer}.")]
    rank = {"self_attention.linear_proj": 0, "input_norm": 1, "self_attention.linear_qkv": 2, "pre_mlp_norm": 3,
            "mlp.fc1": 4, "mlp.fc2": 5}  # fmt: skip
    return head + sorted(mine, key=lambda p: rank[p["name"].split(".", 2)[2].rsplit(".", 1)[0]])


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def cuda_state(seed: int, offset: int) -> torch.Tensor:
    return torch.tensor(list(struct.pack("<Qq", seed, offset)), dtype=torch.uint8)


def rng_state(seed: int, pp: int, tp: int, draws: int) -> list[dict]:
    """Megatron's rng_state of rank (pp, tp) after seeding and `draws` draws of training."""
    s = seed + 100 * pp
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    for _ in range(draws):
        random.random(), np.random.rand(), torch.rand(1)
    return [{
        "random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": cuda_state(s, 4 * draws),
        "rng_tracker_states": {"data-parallel-rng": cuda_state(s, 4 * draws),
                               "model-parallel-rng": cuda_state(s + 2718 + tp, 4 * draws),
                               "expert-parallel-rng": cuda_state(s + 1024 + tp, 4 * draws)},
    }]  # fmt: skip


def make_args(m: ModelSpec, par: ParallelConfig, pp: int, tp: int, **extra: Any) -> argparse.Namespace:
    step = m.make_vocab_size_divisible_by * par.tp
    fields = dict(
        num_layers=m.num_layers, hidden_size=m.hidden, ffn_hidden_size=m.ffn_hidden, num_attention_heads=m.heads,
        kv_channels=m.head_dim, group_query_attention=m.query_groups != m.heads, num_query_groups=m.query_groups,
        max_position_embeddings=m.max_position or 4096, position_embedding_type="learned_absolute" if m.max_position else "rope",
        add_position_embedding=bool(m.max_position), normalization="LayerNorm" if m.norm == "layernorm" else "RMSNorm",
        swiglu=m.glu, add_bias_linear=m.bias_linear, add_qkv_bias=m.bias_linear,
        untie_embeddings_and_output_weights=not m.tied_embeddings, make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
        padded_vocab_size=-(-m.vocab // step) * step, vocab_size=m.vocab, tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp, virtual_pipeline_model_parallel_size=par.vpp if par.vpp > 1 else None,
        num_layers_per_virtual_pipeline_stage=m.num_layers // (par.pp * par.vpp) if par.vpp > 1 else None,
        decoder_first_pipeline_num_layers=par.first, decoder_last_pipeline_num_layers=par.last,
        data_parallel_size=par.dp, world_size=par.tp * par.pp * par.dp, rank=pp * par.tp * par.dp + tp,
        local_rank=pp * par.tp * par.dp + tp, use_distributed_optimizer=bool(par.zero), overlap_grad_reduce=False,
        ddp_bucket_size=None, fp16=m.dtype == "float16", bf16=m.dtype == "bfloat16", params_dtype=TORCH[m.dtype],
        seed=1234, data_parallel_random_init=False, optimizer="adam", lr=3e-4, weight_decay=0.1,
        global_batch_size=16, micro_batch_size=2, consumed_train_samples=1600, ckpt_format="torch",
        expert_model_parallel_size=1, context_parallel_size=1, num_experts=None,
    )  # fmt: skip
    fields.update(extra)
    return argparse.Namespace(**fields)


def bucket_world(params: list[dict], numels: dict[str, int], dp: int, bucket_size: int | None) -> tuple[dict, int]:
    """Megatron's _ParamAndGradBuffer loop (main, 2025): param key -> [start, stop) in the
    world tensor of distrib_optim.pt, and the world tensor's length."""
    pad = lambda n, k: -(-n // k) * k  # noqa: E731
    state = {"bucket_start": 0, "params": [], "id": 0}
    unpadded, starts, index = [], [], {}

    def update(end: int) -> int:
        unpadded.append(end - state["bucket_start"])
        starts.append(state["bucket_start"])
        state["bucket_start"] = pad(end, math.lcm(dp, 128))
        state["params"], state["id"] = [], state["id"] + 1
        return state["bucket_start"]

    param_start = param_end = 0
    for p in params[::-1]:
        param_start = pad(param_start, 64)
        if p["shared"] and state["params"]:
            param_start = update(param_start)
        param_end = param_start + numels[p["key"]]
        index[p["key"]] = (param_start, param_end, state["id"])
        state["params"].append(p)
        if (bucket_size is not None and param_end - state["bucket_start"] >= bucket_size) or p["shared"]:
            param_start = update(param_end)
        else:
            param_start = param_end
    if state["params"]:
        update(param_end)
    shift = [starts[b] - sum(unpadded[:b]) for b in range(len(starts))]
    return {k: (s - shift[b], e - shift[b]) for k, (s, e, b) in index.items()}, sum(unpadded)
