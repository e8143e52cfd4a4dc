"""Unit tables for the Megatron adapter: the layout syntax, the naming table, the distributed
optimizer's buckets (docs/conventions.md §4.2.3 worked example), RNG derivation and target layouts."""

from __future__ import annotations

import argparse
import random
import struct

import numpy as np
import pytest
import torch

from tenplex.frameworks import parse_layout
from tenplex.frameworks.megatron.args import args_for
from tenplex.frameworks.megatron.distrib import buckets, world_slots
from tenplex.frameworks.megatron.meta import MegatronMeta
from tenplex.frameworks.megatron.names import Naming, detect_naming, extra_module
from tenplex.frameworks.megatron.read import qkv_v2
from tenplex.frameworks.megatron.reshard import target_layout
from tenplex.frameworks.megatron.rng import cuda_state, rng_layout, rng_state
from tenplex.frontends.parallel import ParallelConfig
from tenplex.frontends.presets import preset
from tenplex.frontends.spec import parse_spec
from tenplex.ir.errors import SpecError


@pytest.mark.parametrize(("text", "want"), [
    ("tp=4,pp=1", {"tp": 4, "pp": 1}),
    ("tp4,pp1,dp2", {"tp": 4, "pp": 1, "dp": 2}),
    (" tp=2, pp=2, vpp=2, zero=1 ", {"tp": 2, "pp": 2, "vpp": 2, "zero": 1}),
    ("tp=1,pp=2,first=1", {"tp": 1, "pp": 2, "first": 1}),
])  # fmt: skip
def test_parse_layout(text, want):
    assert parse_layout(text) == want


@pytest.mark.parametrize(("text", "message"), [
    ("tp=4,ep=2", "token 'ep=2' is not one of"),
    ("tp=4,tp=2", "tp is given twice"),
    ("tp=x", "token 'tp=x'"),
    ("", "empty"),
])  # fmt: skip
def test_parse_layout_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_layout(text)


KEYS = {  # frontend key: (legacy, legacy before Sept 2023, mcore local, mcore TE)
    "language_model/encoder/layers.3.input_norm.weight": (
        "language_model/encoder/layers.3.input_norm.weight", "language_model/encoder/layers.3.input_layernorm.weight",
        "decoder.layers.3.input_layernorm.weight", "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"),
    "language_model/encoder/layers.0.self_attention.query_key_value.bias": (
        "language_model/encoder/layers.0.self_attention.query_key_value.bias",) * 2 + (
        "decoder.layers.0.self_attention.linear_qkv.bias",) * 2,
    "language_model/encoder/layers.1.post_attention_norm.bias": (
        "language_model/encoder/layers.1.post_attention_norm.bias",
        "language_model/encoder/layers.1.post_attention_layernorm.bias",
        "decoder.layers.1.pre_mlp_layernorm.bias", "decoder.layers.1.mlp.linear_fc1.layer_norm_bias"),
    "language_model/encoder/layers.2.mlp.dense_4h_to_h.weight": (
        "language_model/encoder/layers.2.mlp.dense_4h_to_h.weight",) * 2 + ("decoder.layers.2.mlp.linear_fc2.weight",) * 2,
    "language_model/encoder/final_norm.weight": (
        "language_model/encoder/final_norm.weight", "language_model/encoder/final_layernorm.weight",
        "decoder.final_layernorm.weight", "decoder.final_layernorm.weight"),
    "word_embeddings_for_head/weight": ("word_embeddings_for_head/weight",) * 2 + ("output_layer.weight",) * 2,
}  # fmt: skip
NAMINGS = (Naming(), Naming(old_norms=True), Naming("mcore"), Naming("mcore", te=True))


@pytest.mark.parametrize("key", sorted(KEYS))
def test_naming_table(key):
    assert tuple(n.key(key) for n in NAMINGS) == KEYS[key]


def test_naming_detection_and_extra_state():
    assert detect_naming(["language_model/encoder/layers.0.input_layernorm.weight"]) == Naming(old_norms=True)
    assert detect_naming(["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"]) == Naming("mcore", te=True)
    assert detect_naming(["something.else"]) is None
    assert extra_module("decoder.layers.4.mlp.linear_fc1._extra_state") == "mlp.linear_fc1"
    assert extra_module("output_layer._extra_state") == "output_layer"
    assert extra_module("decoder.layers.4.mlp.router._extra_state") is None


def test_mcore_order_puts_linear_proj_before_linear_qkv():
    from tenplex.frontends.params import layer_params

    params = layer_params(preset("gpt-tiny"), 0, 0, range(0))
    order = [Naming("mcore").parts(p.key)[1] for p in Naming("mcore").order(params)]
    assert order.index("self_attention.linear_proj") < order.index("self_attention.linear_qkv")
    te = [Naming("mcore", te=True).key(p.key).split(".", 3)[-1] for p in Naming("mcore", te=True).order(params)]
    assert te[:4] == ["self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
                      "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias"]  # fmt: skip


def test_buckets_worked_example():
    """docs/conventions.md §4.2.3: A [10,4], B [4,4], C [4], DP 2, one bucket: C [0,4), B [64,80),
    A [128,168), 168 elements; with the bucket closed after B, A sits at [80,120) of 120."""
    params = [("A", 40, False), ("B", 16, False), ("C", 4, False)]
    assert world_slots(buckets(params, 2, None)) == ({"C": (0, 4), "B": (64, 80), "A": (128, 168)}, 168)
    assert world_slots(buckets(params, 2, 80)) == ({"C": (0, 4), "B": (64, 80), "A": (80, 120)}, 120)


def test_shared_embedding_gets_its_own_bucket():
    """The tied embedding (first stage, PP > 1) closes the bucket before it at its 64-aligned start."""
    params = [("emb", 100, True), ("w", 30, False), ("b", 5, False)]
    slots, total = world_slots(buckets(params, 2, None))
    assert slots == {"b": (0, 5), "w": (64, 94), "emb": (128, 228)} and total == 228


@pytest.mark.parametrize("version", [0, 1.0])
def test_qkv_v2_permutation(version):
    """Per rank, 2 heads of head_dim 2: grouped rows are [q0 k0 v0 q1 k1 v1]."""
    grouped = np.array([[f"{w}{h}.{i}"] for h in range(2) for w in "qkv" for i in range(2)])
    old = grouped.reshape(2, 3, 2, 1).swapaxes(0, 1) if version == 0 else grouped.reshape(2, 3, 2, 1).swapaxes(1, 2)
    assert qkv_v2(np.ascontiguousarray(old).reshape(12, 1), version, 2, 2).tolist() == grouped.tolist()


def test_rng_state_follows_the_seed_rules():
    (entry,) = rng_state(1234, {"seed_offset": 100, "model_parallel_seed_offset": 2718 + 3}, 2, False,
                         ("random_rng_state", "cuda_rng_state", "rng_tracker_states"), ("model-parallel-rng",))  # fmt: skip
    assert list(entry) == ["random_rng_state", "cuda_rng_state", "rng_tracker_states"]
    assert entry["random_rng_state"] == random.Random(1334).getstate()
    assert bytes(entry["cuda_rng_state"].tolist()) == struct.pack("<Qq", 1334, 0)
    assert torch.equal(entry["rng_tracker_states"]["model-parallel-rng"], cuda_state(1334 + 2718 + 3))
    old = cuda_state(1334, 816)  # torch <= 2.0: 800 bytes of retired MTGP state first
    assert old.numel() == 816 and set(old[:800].tolist()) == {255} and torch.equal(old[800:], cuda_state(1334))
    assert rng_layout([{"cuda_rng_state": old, "rng_tracker_states": {"model-parallel-rng": old}}]) == (
        ("cuda_rng_state", "rng_tracker_states"), ("model-parallel-rng",), 816)
    per_dp = rng_state(1234, {"seed_offset": 0, "model_parallel_seed_offset": 2718}, 3, True, ("random_rng_state",), ())
    assert [e["random_rng_state"] for e in per_dp] == [random.Random(1234 + 10 * d).getstate() for d in range(3)]


def _meta(spec: str) -> MegatronMeta:
    job = parse_spec(spec)
    return MegatronMeta(job.model, job.parallel, Naming(), argparse.Namespace(seed=1))


def test_target_layout_keeps_the_model_and_defaults():
    meta = _meta("gpt-tiny:tp2,pp2,dp2,zero1@1x8")
    assert target_layout(meta, "tp=4,pp=1") == ParallelConfig(tp=4, pp=1, dp=2, zero=1)
    assert target_layout(meta, {"tp": 1, "pp": 4, "zero": 0}) == ParallelConfig(tp=1, pp=4, dp=2)
    assert target_layout(meta, ParallelConfig(tp=1, pp=1)) == ParallelConfig(tp=1, pp=1, dp=2)
    assert target_layout(meta, "gpt-tiny:tp4,pp1@1x4").dp == 1
    with pytest.raises(SpecError, match="differs from the checkpoint's model"):
        target_layout(meta, "llama-tiny:tp2@1x2")
    with pytest.raises(SpecError, match="does not divide heads"):
        target_layout(meta, "tp=3,pp=1")


def test_args_rewritten_for_the_layout():
    job = parse_spec("gpt-tiny:tp2,pp2,vocab=1100@1x4")
    args = argparse.Namespace(tensor_model_parallel_size=4, pipeline_model_parallel_size=1, data_parallel_size=1,
                              world_size=4, padded_vocab_size=1536, rank=0, lr=0.1,
                              virtual_pipeline_model_parallel_size=None, use_distributed_optimizer=False)  # fmt: skip
    out = args_for(args, job.model, job.parallel, pp=1, tp=1)
    assert (out.tensor_model_parallel_size, out.pipeline_model_parallel_size, out.world_size) == (2, 2, 4)
    assert (out.padded_vocab_size, out.rank, out.lr) == (1280, 3, 0.1)
    assert list(vars(out)) == list(vars(args)) and args.tensor_model_parallel_size == 4
