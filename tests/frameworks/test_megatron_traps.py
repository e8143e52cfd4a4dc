"""The resharding traps of docs/conventions.md §7 and the reference's checkable behaviours
(docs/reference-tenplex.md §9), asserted on the files Megatron would load: one named test per trap,
each comparing target rank files with source rank files by Megatron's rules."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fixtures.megatron.builder import Builder, chunk_layers
from fixtures.megatron.tree import _no_decay, build_tree
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frameworks.megatron.rng import cuda_state
from tenplex.frameworks.megatron.write import write_megatron
from tenplex.frontends.spec import parse_spec
from tests.frameworks.megatron_helpers import diff, load_tree, reshard

ENC = "language_model/encoder"


@pytest.fixture(scope="module")
def trip(tmp_path_factory):
    """trip(spec, layout, **options) -> (src files, dst files, src spec, dst meta), cached."""
    cache: dict = {}

    def get(spec_text: str, layout: str, **options):
        key = (spec_text, layout, tuple(sorted(options.items())))
        if key not in cache:
            root = tmp_path_factory.mktemp("trap")
            spec = parse_spec(spec_text)
            build_tree(root / "a", spec.model, spec.parallel, **options)
            dst, arrays, values, meta = reshard(read_megatron(root / "a"), layout)
            write_megatron(dst, arrays, values, meta, root / "b")
            cache[key] = (load_tree(root / "a"), load_tree(root / "b"), spec, meta)
        return cache[key]

    return get


def rank(files: dict, tp: int, pp: int, pp_size: int, name: str = "model_optim_rng.pt") -> dict:
    suffix = "" if pp_size == 1 else f"_{pp:03d}"
    return files[f"iter_0000100/mp_rank_{tp:02d}{suffix}/{name}"]


def enc(state: dict, chunk: str = "model") -> dict:
    return state[chunk]["language_model"]["encoder"]


def state_index(model, par, pp: int, key: str, naming: str = "legacy") -> tuple[int, int, int]:
    """(group, position, flat index) of parameter `key` on stage `pp`, by the builder's statement
    of Megatron's param-group rule (first appearance of the weight-decay class)."""
    b, layers = Builder(model), chunk_layers(model, par)
    flat = [p for vp in range(par.vpp) for p in b.params(par, pp, vp, layers[pp, vp], naming)]
    index = 0
    for g, c in enumerate(dict.fromkeys(_no_decay(p) for p in flat)):
        for j, p in enumerate(p for p in flat if _no_decay(p) == c):
            if p["key"] == key:
                return g, j, index
            index += 1
    raise KeyError(key)


def adam(state: dict, model, par, pp: int, key: str, naming: str = "legacy") -> dict[str, torch.Tensor]:
    g, j, i = state_index(model, par, pp, key, naming)
    opt = state["optimizer"]
    return {**opt["optimizer"]["state"][i], "fp32": opt["fp32_from_fp16_params"][g][j]}


def test_qkv_gqa_merges_contiguously(trip):
    """§7 #2, §9.6: grouped QKV (here GQA, 4 heads in 2 groups) merges by plain dim-0 cat in
    ascending source rank (§9.10), weights and Adam state alike."""
    a, b, spec, meta = trip("llama-tiny:tp2,pp1@1x2", "tp=1,pp=1")
    key = f"{ENC}/layers.0.self_attention.query_key_value.weight"
    want = torch.cat([enc(rank(a, r, 0, 1))["layers.0.self_attention.query_key_value.weight"] for r in (0, 1)])
    assert torch.equal(enc(rank(b, 0, 0, 1))["layers.0.self_attention.query_key_value.weight"], want)
    moments = [adam(rank(a, r, 0, 1), spec.model, spec.parallel, 0, key)["exp_avg"] for r in (0, 1)]
    assert torch.equal(adam(rank(b, 0, 0, 1), spec.model, meta.parallel, 0, key)["exp_avg"], torch.cat(moments))


@pytest.mark.parametrize(("src", "layout", "pick"), [
    ("tp2", "tp=4,pp=1", lambda a, r: a[r // 2][(r % 2) * 48:(r % 2 + 1) * 48]),  # §9.6 TP2->TP4
    ("tp4", "tp=2,pp=1", lambda a, r: torch.cat([a[2 * r], a[2 * r + 1]])),  # §9.6 TP4->TP2
])  # fmt: skip
def test_qkv_rechunks_by_rank_order(trip, src, layout, pick):
    a, b, spec, meta = trip(f"gpt-tiny:{src},pp1@1x4", layout)
    name = "layers.1.self_attention.query_key_value.weight"
    shards = [enc(rank(a, r, 0, 1))[name] for r in range(spec.parallel.tp)]
    for r in range(meta.parallel.tp):
        assert torch.equal(enc(rank(b, r, 0, 1))[name], pick(shards, r))


def test_swiglu_halves_per_rank(trip):
    """§7 #1: each TP rank holds [W_r; V_r]; TP2 -> TP1 gives [W_0; W_1; V_0; V_1], not cat(r0, r1),
    for the weight, its fp32 master and both moments."""
    a, b, spec, meta = trip("llama-tiny:tp2,pp1@1x2", "tp=1,pp=1")
    key = f"{ENC}/layers.1.mlp.dense_h_to_4h.weight"
    for kind in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
        if kind == "weight":
            src = [enc(rank(a, r, 0, 1))["layers.1.mlp.dense_h_to_4h.weight"] for r in (0, 1)]
            got = enc(rank(b, 0, 0, 1))["layers.1.mlp.dense_h_to_4h.weight"]
        else:
            src = [adam(rank(a, r, 0, 1), spec.model, spec.parallel, 0, key)[kind] for r in (0, 1)]
            got = adam(rank(b, 0, 0, 1), spec.model, meta.parallel, 0, key)[kind]
        halves = [torch.chunk(s, 2) for s in src]
        assert torch.equal(got, torch.cat([halves[0][0], halves[1][0], halves[0][1], halves[1][1]])), kind
        assert not torch.equal(got, torch.cat(src))


def test_vocab_repadded_with_zero_rows(trip):
    """§7 #7, §9.5 scaled down: V=1100, m=128: TP2 pads to 1280 (640 rows a rank), TP4 to 1536
    (384 a rank). Rank 1 = src0[384:640] ++ src1[0:128]; rank 2 = src1[128:460] ++ 52 zero rows;
    rank 3 is all padding. Old padding rows (7.0 in the source) never survive; moments and masters
    of new rows are zero; args.padded_vocab_size follows."""
    a, b, spec, meta = trip("gpt-tiny:tp2,pp1,vocab=1100@1x2", "tp=4,pp=1", pad_value=7.0)
    word = lambda s: s["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]  # noqa: E731
    src = [word(rank(a, r, 0, 1)) for r in (0, 1)]
    got = [word(rank(b, r, 0, 1)) for r in range(4)]
    assert rank(a, 0, 0, 1)["args"].padded_vocab_size == 1280 and rank(b, 3, 0, 1)["args"].padded_vocab_size == 1536
    assert torch.equal(got[1], torch.cat([src[0][384:640], src[1][0:128]]))
    assert torch.equal(got[2][:332], src[1][128:460]) and not got[2][332:].any() and not got[3].any()
    key = "language_model/embedding/word_embeddings/weight"
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert not adam(rank(b, 2, 0, 1), spec.model, meta.parallel, 0, key)[kind][332:].any()
        assert not adam(rank(b, 3, 0, 1), spec.model, meta.parallel, 0, key)[kind].any()


def test_row_parallel_splits_dim_1(trip):
    """§7 #8, §9.8: dense.weight [h, h/TP] TP2 -> TP4 takes column halves of the source shards."""
    a, b, _, _ = trip("gpt-tiny:tp2,pp1@1x4", "tp=4,pp=1")
    for name in ("layers.0.self_attention.dense.weight", "layers.0.mlp.dense_4h_to_h.weight"):
        src = [enc(rank(a, r, 0, 1))[name] for r in (0, 1)]
        for r in range(4):
            half = src[r // 2].shape[1] // 2
            assert torch.equal(enc(rank(b, r, 0, 1))[name], src[r // 2][:, (r % 2) * half:(r % 2 + 1) * half])


def test_replicated_tensors_copied_whole(trip):
    """§7 #9, §9.9: norms, row-parallel biases and position embeddings are copied, never cat or summed."""
    a, b, _, _ = trip("gpt-tiny:tp2,pp1@1x4", "tp=4,pp=1")
    names = ("layers.0.input_norm.weight", "layers.0.input_norm.bias", "layers.0.self_attention.dense.bias",
             "layers.0.mlp.dense_4h_to_h.bias", "final_norm.weight")  # fmt: skip
    for r in range(4):
        for name in names:
            assert torch.equal(enc(rank(b, r, 0, 1))[name], enc(rank(a, 0, 0, 1))[name])
        pos = rank(b, r, 0, 1)["model"]["language_model"]["embedding"]["position_embeddings"]["weight"]
        assert torch.equal(pos, rank(a, 0, 0, 1)["model"]["language_model"]["embedding"]["position_embeddings"]["weight"])


def test_tied_copy_created_with_its_adam_state(trip):
    """§7 #10, §9.4, §9.14: PP1 -> PP2 creates word_embeddings_for_head on the last stage from the
    embedding, with its moments and master (the reference loses the moments)."""
    a, b, spec, meta = trip("gpt-tiny:tp1,pp1@1x1", "tp=1,pp=2")
    emb_key, head_key = "language_model/embedding/word_embeddings/weight", "word_embeddings_for_head/weight"
    emb = rank(a, 0, 0, 1)["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]
    assert torch.equal(rank(b, 0, 1, 2)["model"]["word_embeddings_for_head"]["weight"], emb)
    src = adam(rank(a, 0, 0, 1), spec.model, spec.parallel, 0, emb_key)
    head = adam(rank(b, 0, 1, 2), spec.model, meta.parallel, 1, head_key)
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert torch.equal(head[kind], src[kind]), kind


def test_tied_copy_dropped_at_pp1(trip):
    a, b, spec, meta = trip("gpt-tiny:tp1,pp2@1x2", "tp=1,pp=1")
    state = rank(b, 0, 0, 1)
    assert "word_embeddings_for_head" not in state["model"]
    n = sum(len(g["params"]) for g in state["optimizer"]["optimizer"]["param_groups"])
    assert n == len(state["optimizer"]["optimizer"]["state"]) == 2 + 4 * 12 + 2


def test_layer_renumbering_pp2_to_pp4(trip):
    """§7 #11, §9.3: 8 layers, PP2 -> PP4: target (pp s, layers.j) = source (pp (2s+j)//4, layers.(2s+j)%4);
    target (pp 3, layers.0) comes from source (pp 1, layers.2)."""
    a, b, _, _ = trip("gpt-tiny:tp1,pp2,layers=8@1x2", "tp=1,pp=4")
    for s in range(4):
        for j in range(2):
            g = 2 * s + j
            for leaf in ("self_attention.query_key_value.weight", "mlp.dense_h_to_4h.bias", "input_norm.weight"):
                got = enc(rank(b, 0, s, 4))[f"layers.{j}.{leaf}"]
                assert torch.equal(got, enc(rank(a, 0, g // 4, 2))[f"layers.{g % 4}.{leaf}"])


def test_virtual_pipeline_is_vp_major(trip):
    """§7 #12: L=4, p=2, v=2: PP0 model0 = layer 0, PP1 model0 = 1, PP0 model1 = 2, PP1 model1 = 3;
    each chunk's keys restart at 0; embeddings in PP0 model0, final norm in PP1 model1."""
    a, b, _, _ = trip("gpt-tiny:tp1,pp1@1x1", "tp=1,pp=2,vpp=2")
    for (pp, vp), g in {(0, 0): 0, (1, 0): 1, (0, 1): 2, (1, 1): 3}.items():
        got = enc(rank(b, 0, pp, 2), f"model{vp}")["layers.0.self_attention.dense.weight"]
        assert torch.equal(got, enc(rank(a, 0, 0, 1))[f"layers.{g}.self_attention.dense.weight"])
    assert "embedding" in rank(b, 0, 0, 2)["model0"]["language_model"]
    assert "final_norm.weight" in rank(b, 0, 1, 2)["model1"]["language_model"]["encoder"]
    assert rank(b, 0, 1, 2)["args"].virtual_pipeline_model_parallel_size == 2


def test_uneven_split_renumbered(trip):
    a, b, _, _ = trip("gpt-tiny:tp1,pp2,first=1@1x2", "tp=1,pp=2")
    assert sorted(k for k in enc(rank(a, 0, 0, 2)) if k.endswith("dense.weight")) == ["layers.0.self_attention.dense.weight"]
    name = "self_attention.dense.weight"
    assert torch.equal(enc(rank(b, 0, 0, 2))[f"layers.1.{name}"], enc(rank(a, 0, 1, 2))[f"layers.0.{name}"])


def test_optimizer_groups_follow_each_stage(trip):
    """§7 #13, §9.12-13: state bound by name; mcore stage 1 starts with a 1-D norm, so its first
    group is the no-decay one; group sizes are the stage's class counts; linear_proj precedes
    linear_qkv in mcore's parameter order."""
    a, b, spec, meta = trip("gpt-tiny:tp1,pp1@1x1", "tp=1,pp=2", naming="mcore")
    groups = [rank(b, 0, pp, 2)["optimizer"]["optimizer"]["param_groups"] for pp in (0, 1)]
    assert [(g["wd_mult"], len(g["params"])) for g in groups[0]] == [(1.0, 10), (0.0, 16)]
    assert [(g["wd_mult"], len(g["params"])) for g in groups[1]] == [(0.0, 18), (1.0, 9)]
    key = "decoder.layers.0.self_attention.linear_proj.weight"
    _, _, i = state_index(spec.model, meta.parallel, 1, key, "mcore")
    src_index = state_index(spec.model, spec.parallel, 0, "decoder.layers.2.self_attention.linear_proj.weight", "mcore")[2]
    got = rank(b, 0, 1, 2)["optimizer"]["optimizer"]["state"][i]["exp_avg"]
    assert torch.equal(got, rank(a, 0, 0, 1)["optimizer"]["optimizer"]["state"][src_index]["exp_avg"])


def test_fp32_masters_resharded_directly(trip):
    """§7 #24: the masters are carried, not re-derived from 16-bit weights."""
    a, b, spec, meta = trip("gpt-tiny:tp2,pp1@1x2", "tp=1,pp=1")
    key = f"{ENC}/layers.0.mlp.dense_4h_to_h.weight"
    got = adam(rank(b, 0, 0, 1), spec.model, meta.parallel, 0, key)["fp32"]
    want = torch.cat([adam(rank(a, r, 0, 1), spec.model, spec.parallel, 0, key)["fp32"] for r in (0, 1)], dim=1)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert not torch.equal(got, enc(rank(b, 0, 0, 1))["layers.0.mlp.dense_4h_to_h.weight"].float())


def test_rng_rederived_per_rank(trip):
    """§7 #21, §9.16: every target rank gets fresh states from seed + 100·pp (+ 2718 + tp for the
    model-parallel tracker), not a copy of a source rank's advanced state."""
    a, b, _, _ = trip("gpt-tiny:tp2,pp2@1x4", "tp=4,pp=1")
    for tp in range(4):
        entry = rank(b, tp, 0, 1)["rng_state"][0]
        assert entry["random_rng_state"] == random.Random(1234).getstate()
        assert np.array_equal(entry["np_rng_state"][1], np.random.RandomState(1234).get_state()[1])
        assert torch.equal(entry["torch_rng_state"], torch.Generator().manual_seed(1234).get_state())
        assert torch.equal(entry["rng_tracker_states"]["model-parallel-rng"], cuda_state(1234 + 2718 + tp))
        assert torch.equal(entry["rng_tracker_states"]["data-parallel-rng"], cuda_state(1234))
    assert rank(a, 0, 0, 2)["rng_state"][0]["random_rng_state"] != random.Random(1234).getstate()


def test_scalars_copied(trip):
    """§9.15: grad scaler, param-group scalars, scheduler, iteration and the rest of args carried."""
    a, b, _, _ = trip("gpt-tiny:tp2,pp2,dtype=float16@1x4", "tp=1,pp=2")
    src, dst = rank(a, 1, 1, 2), rank(b, 0, 1, 2)
    assert diff(src["optimizer"]["grad_scaler"], dst["optimizer"]["grad_scaler"]) == []
    for g_src, g_dst in zip(src["optimizer"]["optimizer"]["param_groups"], dst["optimizer"]["optimizer"]["param_groups"]):
        assert {k: v for k, v in g_src.items() if k != "params"} == {k: v for k, v in g_dst.items() if k != "params"}
    assert src["opt_param_scheduler"] == dst["opt_param_scheduler"] and dst["iteration"] == 100
    changed = {k for k in vars(src["args"]) if getattr(src["args"], k) != getattr(dst["args"], k)}
    assert changed == {"tensor_model_parallel_size", "world_size", "rank", "local_rank"}


def test_dp_only_change_copies_each_shard(trip):
    """§9.2: a DP-only change leaves every (pp, tp) file's tensors as they were; the distributed
    optimizer's world buffers do not depend on DP either."""
    a, b, _, _ = trip("gpt-tiny:tp2,pp2,dp1,zero1@1x4", "tp=2,pp=2,dp=2")
    skip = ("rng_state", "args")
    assert diff(a, b, skip=skip) == []
    assert rank(b, 0, 0, 2)["args"].data_parallel_size == 2
