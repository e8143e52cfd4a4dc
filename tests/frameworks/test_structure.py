"""Structure directories (docs/reference-tenplex.md §2.3): Megatron trees built the way Megatron writes them are
written as structures, read back, and must give the PTC that read_megatron and the frontend give;
a hand-written directory in the reference's exact format must parse; PTCs read from structures
must compile into verified plans. Broken directories: test_structure_errors.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.megatron.tree import build_tree
from tenplex.compiler import compile_plan
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frameworks.structure.files import NOT_PRIMITIVE, RankMap, model_key_paths, tensor_leaves
from tenplex.frameworks.structure.model import guess_heads
from tenplex.frameworks.structure.read import inspect_structure, read_structure, write_structure
from tenplex.frontends.spec import parse_spec

CASES = {  # name: (compact spec, builder options)
    "pp1_tp1_fp16": ("gpt-tiny:tp1,pp1,dtype=float16@1x1", {}),
    "pp1_tp2_dp2_fp32": ("gpt-tiny:tp2,pp1,dp2,dtype=float32@1x4", {}),
    "pp2_tp2_fp16_tied": ("gpt-tiny:tp2,pp2,dtype=float16@1x4", {}),
    "pp2_tp4_dp2_fp16": ("gpt-tiny:tp4,pp2,dp2,dtype=float16@1x16", {}),
    "pp4_tp1_fp32": ("gpt-tiny:tp1,pp4,dtype=float32@1x4", {}),
    "no_optimizer_bf16": ("gpt-tiny:tp2,pp2,noopt@1x4", {"optimizer": False}),
    "llama_gqa_swiglu_untied": ("llama-tiny:tp2,pp2@1x4", {}),
    "uneven_first1": ("gpt-tiny:tp2,pp2,first=1,dtype=float16@1x4", {}),
    "vpp2": ("gpt-tiny:tp1,pp2,vpp2,dtype=float16@1x2", {}),
    "mcore_names": ("llama-tiny:tp2,pp1@1x2", {"naming": "mcore"}),
    "chained_v2_groups": ("gpt-tiny:tp1,pp2,dtype=float16@1x2", {"group_rule": "v2", "chained": True}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    text, options = CASES[request.param]
    spec = parse_spec(text)
    root = tmp_path_factory.mktemp(request.param)
    build_tree(root / "ckpt", spec.model, spec.parallel, **options)
    return request.param, spec, read_megatron(root / "ckpt"), write_structure(root / "ckpt", root / "structure")


def _read(spec, path, **extra):
    """read_structure with what the shapes do not say (heads only when `extra` asks)."""
    return read_structure(path, vocab=spec.model.vocab, dtype=spec.model.dtype, **extra)


def test_ptc_equals_read_megatron_and_the_frontends(case):
    _, spec, ckpt, structure = case
    ptc, _ = _read(spec, structure)
    assert ptc == ckpt.ptc == spec.build()


def test_model_and_layout_equal_read_megatrons_given_heads(case):
    _, spec, ckpt, structure = case
    _, info = _read(spec, structure, heads=spec.model.heads)
    assert info.model == ckpt.meta.model == spec.model
    assert info.parallel == ckpt.meta.parallel
    assert (info.tp, info.pp, info.dp) == (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp)


def test_written_in_the_reference_format(case):
    _, spec, _, structure = case
    par = spec.parallel
    grid = RankMap(par.tp, par.pp, par.dp)
    rank_map = json.loads((structure / "rank_map.json").read_text())
    assert list(rank_map) == [str(r) for r in range(grid.world)]
    for r, entry in rank_map.items():  # Megatron's order: tp fastest, then dp, then pp
        assert int(r) == grid.rank(entry["pp_rank"], entry["mp_rank"], entry["dp_rank"])
    dirs = sorted(p.name for p in structure.iterdir() if p.is_dir())
    assert dirs == sorted(f"rank{grid.rank(p, t):02d}" for p in range(par.pp) for t in range(par.tp))
    keys = json.loads((structure / "model_keys.json").read_text())
    for p in range(par.pp):
        for t in range(par.tp):
            name = f"mp_rank_{t:02d}.json" if par.pp == 1 else f"mp_rank_{t:02d}_{p:03d}.json"
            file = structure / f"rank{grid.rank(p, t):02d}" / name
            doc = json.loads(file.read_text())
            assert doc["args"] == NOT_PRIMITIVE and doc["rng_state"][0]["np_rng_state"][1] == NOT_PRIMITIVE
            assert keys[str(grid.rank(p, t))] == model_key_paths(doc, file)
    assert all(k[0].startswith("model") for entry in keys.values() for k in entry)
    assert not [p for p in structure.parent.iterdir() if ".tmp" in p.name]


def test_from_the_frontends_ptc_round_trips(case, tmp_path):
    _, spec, _, _ = case
    structure = write_structure(spec.build(), tmp_path / "s")
    ptc, info = _read(spec, structure, heads=spec.model.heads)
    assert ptc == spec.build() and info.model == spec.model


def test_notes_say_what_was_assumed(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp2,dtype=float16@1x4")
    _, info = read_structure(write_structure(spec.build(), tmp_path / "s"))
    text = "\n".join(info.notes)
    for part in ("heads assumed = 2 (hidden/64 = 1 does not fit tp=2)", "vocab = 1024 padded rows",
                 "fp16 with fp32 master copies and a grad scaler", "tied word_embeddings_for_head on the last stage",
                 "Megatron 23.06 names"):  # fmt: skip
        assert part in text
    assert info.model.vocab == 1024 and info.precision == "fp16"


def test_group_order_the_reference_would_misbind_is_noted(case):
    name, spec, _, structure = case
    _, info = _read(spec, structure)
    # megatron-core orders groups by first appearance: a stage opening with a norm puts the
    # no-weight-decay group first, which the reference's [decay, no decay] split gets wrong
    first_appearance = CASES[name][1].get("group_rule", "first") == "first"
    noted = any("model_keys.json order" in n for n in info.notes)
    assert noted == (spec.model.has_optimizer and spec.parallel.pp > 1 and first_appearance)


def test_precision_without_optimizer_from_dtype_the_path_or_fp16(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp1,noopt,dtype=float32@1x2")
    plain = write_structure(spec.build(), tmp_path / "plain")
    config = tmp_path / "megatron-lm" / "fp32" / "gpt" / "tiny" / "pp01" / "mp02" / "dp01"
    shutil.copytree(plain, config)
    assert read_structure(config)[1].model.dtype == "float32"
    assert read_structure(plain, dtype="bf16")[1].model.dtype == "bfloat16"
    _, info = read_structure(plain)
    assert info.model.dtype == "float16" and any(n.startswith("fp16 assumed") for n in info.notes)


def test_mcore_tied_head_with_pp2_is_assumed_unless_given(tmp_path):
    spec = parse_spec("llama-tiny:tp1,pp2@1x2")  # untied: output_layer.weight looks like the tied copy
    build_tree(tmp_path / "ckpt", spec.model, spec.parallel, naming="mcore")
    structure = write_structure(tmp_path / "ckpt", tmp_path / "s")
    _, info = read_structure(structure, vocab=1000)
    assert info.model.tied_embeddings and any("tied output layer assumed" in n for n in info.notes)
    ptc, info = read_structure(structure, vocab=1000, tied=False)
    assert ptc == read_megatron(tmp_path / "ckpt").ptc and not info.model.tied_embeddings


@pytest.mark.parametrize(("hidden", "q", "kv", "tp", "want"), [
    (1536, 1536, 1536, 8, 24),  # gpt-large: hidden/64 (the true 16 gives the same shards)
    (1536, 1536, 1536, 16, 16),  # 24 does not divide by 16
    (64, 64, 32, 2, 4),  # llama-tiny GQA: 4 heads of 16 in 2 groups
    (64, 64, 64, 1, 1),
    (6, 6, 6, 4, None),  # nothing divides by tp=4
])  # fmt: skip
def test_guess_heads(hidden, q, kv, tp, want):
    assert guess_heads(hidden, q, kv, tp) == want


def test_inspect_reports_layout_model_precision_and_notes(tmp_path):
    spec = parse_spec("llama-tiny:tp2,pp2@1x4")
    lines = inspect_structure(write_structure(spec.build(), tmp_path / "s"))
    assert lines[0] == "layout: tp=2, pp=2, dp=1 (4 ranks, 4 rank files)"
    assert "4 heads in 2 query groups of 16" in lines[1] and "(swiglu)" in lines[1] and "untied head" in lines[1]
    assert lines[2].startswith("precision: bf16") and lines[-1] == "problems: none"


# The reference's format exactly (docs/reference-tenplex.md §2.3): a tiny Megatron 23.06 GPT (2 layers, hidden
# 64, ffn 256, vocab 1000 padded to 1024, 128 positions), PP=2, TP=2, DP=1, fp16; rank 0 and 1
# hold stage 0, ranks 2 and 3 stage 1 (the TP ranks have equal shapes). Lists shortened.
_LAYER = """
        "layers.0.input_layernorm.weight": {"tensor": [64]},
        "layers.0.input_layernorm.bias": {"tensor": [64]},
        "layers.0.self_attention.query_key_value.weight": {"tensor": [96, 64]},
        "layers.0.self_attention.query_key_value.bias": {"tensor": [96]},
        "layers.0.self_attention.dense.weight": {"tensor": [64, 32]},
        "layers.0.self_attention.dense.bias": {"tensor": [64]},
        "layers.0.post_attention_layernorm.weight": {"tensor": [64]},
        "layers.0.post_attention_layernorm.bias": {"tensor": [64]},
        "layers.0.mlp.dense_h_to_4h.weight": {"tensor": [128, 64]},
        "layers.0.mlp.dense_h_to_4h.bias": {"tensor": [128]},
        "layers.0.mlp.dense_4h_to_h.weight": {"tensor": [64, 128]},
        "layers.0.mlp.dense_4h_to_h.bias": {"tensor": [64]}"""
_TAIL = """
  "opt_param_scheduler": {"max_lr": 0.00015, "lr_warmup_steps": 0, "num_steps": 6400, "lr_decay_style": "cosine",
    "lr_decay_steps": 6400, "min_lr": 1e-05, "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
    "wd_incr_steps": 6400},
  "rng_state": [{"random_rng_state": [3, [2147483648, 766982754, 497961170], null],
    "np_rng_state": ["MT19937", "NotPrimitiveNorTensor", 624, 0, 0.0], "torch_rng_state": {"tensor": [5056]},
    "cuda_rng_state": {"tensor": [16]}, "rng_tracker_states": {"model-parallel-rng": {"tensor": [16]}}}]
}"""
_GROUP = '"lr_mult": 1.0, "lr": 0.00015, "bias_correction": true, "betas": [0.9, 0.999], "eps": 1e-08'
STAGE0 = """{
  "args": "NotPrimitiveNorTensor", "checkpoint_version": 3.0, "iteration": 50,
  "model": {"language_model": {
    "embedding": {"word_embeddings": {"weight": {"tensor": [512, 64]}},
                  "position_embeddings": {"weight": {"tensor": [128, 64]}}},
    "encoder": {""" + _LAYER + """}}},
  "optimizer": {
    "optimizer": {
      "state": {
        "0": {"exp_avg": {"tensor": [512, 64]}, "exp_avg_sq": {"tensor": [512, 64]}},
        "1": {"exp_avg": {"tensor": [128, 64]}, "exp_avg_sq": {"tensor": [128, 64]}},
        "2": {"exp_avg": {"tensor": [96, 64]}, "exp_avg_sq": {"tensor": [96, 64]}},
        "3": {"exp_avg": {"tensor": [64, 32]}, "exp_avg_sq": {"tensor": [64, 32]}},
        "4": {"exp_avg": {"tensor": [128, 64]}, "exp_avg_sq": {"tensor": [128, 64]}},
        "5": {"exp_avg": {"tensor": [64, 128]}, "exp_avg_sq": {"tensor": [64, 128]}},
        "6": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "7": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "8": {"exp_avg": {"tensor": [96]}, "exp_avg_sq": {"tensor": [96]}},
        "9": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "10": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "11": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "12": {"exp_avg": {"tensor": [128]}, "exp_avg_sq": {"tensor": [128]}},
        "13": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}}},
      "param_groups": [
        {"wd_mult": 1.0, """ + _GROUP + """, "weight_decay": 0.01, "step": 50, "params": [0, 1, 2, 3, 4, 5]},
        {"wd_mult": 0.0, """ + _GROUP + """, "weight_decay": 0.0, "step": 50,
         "params": [6, 7, 8, 9, 10, 11, 12, 13]}]},
    "grad_scaler": {"scale": {"tensor": [1]}, "growth_tracker": 0, "hysteresis_tracker": 2},
    "fp32_from_fp16_params": [
      [{"tensor": [512, 64]}, {"tensor": [128, 64]}, {"tensor": [96, 64]}, {"tensor": [64, 32]},
       {"tensor": [128, 64]}, {"tensor": [64, 128]}],
      [{"tensor": [64]}, {"tensor": [64]}, {"tensor": [96]}, {"tensor": [64]}, {"tensor": [64]}, {"tensor": [64]},
       {"tensor": [128]}, {"tensor": [64]}]]},""" + _TAIL  # fmt: skip
STAGE1 = """{
  "args": "NotPrimitiveNorTensor", "checkpoint_version": 3.0, "iteration": 50,
  "model": {
    "language_model": {"encoder": {""" + _LAYER + """,
        "final_layernorm.weight": {"tensor": [64]},
        "final_layernorm.bias": {"tensor": [64]}}},
    "word_embeddings_for_head": {"weight": {"tensor": [512, 64]}}},
  "optimizer": {
    "optimizer": {
      "state": {
        "0": {"exp_avg": {"tensor": [96, 64]}, "exp_avg_sq": {"tensor": [96, 64]}},
        "1": {"exp_avg": {"tensor": [64, 32]}, "exp_avg_sq": {"tensor": [64, 32]}},
        "2": {"exp_avg": {"tensor": [128, 64]}, "exp_avg_sq": {"tensor": [128, 64]}},
        "3": {"exp_avg": {"tensor": [64, 128]}, "exp_avg_sq": {"tensor": [64, 128]}},
        "4": {"exp_avg": {"tensor": [512, 64]}, "exp_avg_sq": {"tensor": [512, 64]}},
        "5": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "6": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "7": {"exp_avg": {"tensor": [96]}, "exp_avg_sq": {"tensor": [96]}},
        "8": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "9": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "10": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "11": {"exp_avg": {"tensor": [128]}, "exp_avg_sq": {"tensor": [128]}},
        "12": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "13": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}},
        "14": {"exp_avg": {"tensor": [64]}, "exp_avg_sq": {"tensor": [64]}}},
      "param_groups": [
        {"wd_mult": 1.0, """ + _GROUP + """, "weight_decay": 0.01, "step": 50, "params": [0, 1, 2, 3, 4]},
        {"wd_mult": 0.0, """ + _GROUP + """, "weight_decay": 0.0, "step": 50,
         "params": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}]},
    "grad_scaler": {"scale": {"tensor": [1]}, "growth_tracker": 0, "hysteresis_tracker": 2},
    "fp32_from_fp16_params": [
      [{"tensor": [96, 64]}, {"tensor": [64, 32]}, {"tensor": [128, 64]}, {"tensor": [64, 128]},
       {"tensor": [512, 64]}],
      [{"tensor": [64]}, {"tensor": [64]}, {"tensor": [96]}, {"tensor": [64]}, {"tensor": [64]}, {"tensor": [64]},
       {"tensor": [128]}, {"tensor": [64]}, {"tensor": [64]}, {"tensor": [64]}]]},""" + _TAIL  # fmt: skip
RANK_MAP = """{"0": {"pp_rank": 0, "mp_rank": 0, "dp_rank": 0}, "1": {"pp_rank": 0, "mp_rank": 1, "dp_rank": 0},
               "2": {"pp_rank": 1, "mp_rank": 0, "dp_rank": 0}, "3": {"pp_rank": 1, "mp_rank": 1, "dp_rank": 0}}"""
_ENC = '["model", "language_model", "encoder", "layers.0.'
_LAYER_KEYS = ", ".join(f'{_ENC}{k}"]' for k in (
    "input_layernorm.weight", "input_layernorm.bias", "self_attention.query_key_value.weight",
    "self_attention.query_key_value.bias", "self_attention.dense.weight", "self_attention.dense.bias",
    "post_attention_layernorm.weight", "post_attention_layernorm.bias", "mlp.dense_h_to_4h.weight",
    "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias"))  # fmt: skip
KEYS0 = ('[["model", "language_model", "embedding", "word_embeddings", "weight"], '
         '["model", "language_model", "embedding", "position_embeddings", "weight"], ' + _LAYER_KEYS + "]")  # fmt: skip
KEYS1 = ("[" + _LAYER_KEYS + ', ["model", "language_model", "encoder", "final_layernorm.weight"], '
         '["model", "language_model", "encoder", "final_layernorm.bias"], ["model", "word_embeddings_for_head", "weight"]]')  # fmt: skip
TINY = "gpt-tiny:tp2,pp2,layers=2,dtype=float16@1x4"


def reference_dir(root: Path) -> Path:
    """The hand-written structure at `root/megatron-lm/fp16/gpt/tiny/pp02/mp02/dp01`."""
    config = root / "megatron-lm" / "fp16" / "gpt" / "tiny" / "pp02" / "mp02" / "dp01"
    for rank, name, text in ((0, "mp_rank_00_000", STAGE0), (1, "mp_rank_01_000", STAGE0),
                             (2, "mp_rank_00_001", STAGE1), (3, "mp_rank_01_001", STAGE1)):  # fmt: skip
        (config / f"rank{rank:02d}").mkdir(parents=True)
        (config / f"rank{rank:02d}" / f"{name}.json").write_text(text)
    (config / "rank_map.json").write_text(RANK_MAP)
    (config / "model_keys.json").write_text(f'{{"0": {KEYS0}, "1": {KEYS0}, "2": {KEYS1}, "3": {KEYS1}}}')
    return config


def test_reference_format_parses(tmp_path):
    ptc, info = read_structure(reference_dir(tmp_path), vocab=1000)
    assert ptc == parse_spec(TINY).build()
    assert (info.tp, info.pp, info.dp, info.precision, info.iteration) == (2, 2, 1, "fp16", 50)
    assert info.naming.old_norms and len(info.files) == 6
    assert not any("model_keys.json order" in n for n in info.notes)  # 23.06 groups: [decay, no decay]


def test_writer_matches_the_reference_format(tmp_path):
    written = write_structure(parse_spec(TINY).build(), tmp_path / "written")
    for rank, name, text in ((0, "mp_rank_00_000", STAGE0), (3, "mp_rank_01_001", STAGE1)):
        file = written / f"rank{rank:02d}" / f"{name}.json"
        got, want = json.loads(file.read_text()), json.loads(text)
        assert list(got) == list(want)
        assert list(tensor_leaves(got, file)) == list(tensor_leaves(want, file))
        assert (
            got["optimizer"]["optimizer"]["param_groups"][0].keys()
            == want["optimizer"]["optimizer"]["param_groups"][0].keys()
        )
    assert json.loads((written / "rank_map.json").read_text()) == json.loads(RANK_MAP)
    assert json.loads((written / "model_keys.json").read_text())["3"] == json.loads(KEYS1)


@pytest.mark.parametrize(("layout", "rank", "name", "groups"), [
    ("tp1,pp1", 0, "mp_rank_00.json", [98, 194]),
    ("tp2,pp2", 0, "mp_rank_00_000.json", [50, 96]),
    ("tp2,pp2", 2, "mp_rank_00_001.json", [49, 98]),
    ("tp2,pp4", 0, "mp_rank_00_000.json", [26, 48]),
])  # fmt: skip
def test_writer_gives_the_references_gpt_large_numbers(layout, rank, name, groups, tmp_path):
    """docs/reference-tenplex.md §2.3 and §3.5: group sizes per stage and rank 2's shapes of GPT-large PP2/TP2."""
    root = write_structure(parse_spec(f"gpt-large:{layout},dp1@1x8").build(), tmp_path / "s")
    doc = json.loads((root / f"rank{rank:02d}" / name).read_text())
    assert [len(g["params"]) for g in doc["optimizer"]["optimizer"]["param_groups"]] == groups
    if (layout, rank) == ("tp2,pp2", 2):
        enc = doc["model"]["language_model"]["encoder"]
        assert enc["layers.0.self_attention.query_key_value.weight"] == {"tensor": [2304, 1536]}
        assert enc["layers.0.mlp.dense_4h_to_h.weight"] == {"tensor": [1536, 3072]}
        assert doc["model"]["word_embeddings_for_head"]["weight"] == {"tensor": [25216, 1536]}


@pytest.mark.parametrize(("src", "dst"), [
    ("reference", "gpt-tiny:tp1,pp1,dp2,layers=2,dtype=float16@1x2"),
    ("gpt-tiny:tp2,pp2,dtype=float16@1x4", "gpt-tiny:tp4,pp1,dp2,dtype=float16@1x8"),
])  # fmt: skip
def test_ptcs_read_from_structures_compile(src, dst, tmp_path):
    a = reference_dir(tmp_path) if src == "reference" else write_structure(parse_spec(src).build(), tmp_path / "a")
    b = write_structure(parse_spec(dst).build(), tmp_path / "b")
    plan = compile_plan(read_structure(a, vocab=1000)[0], read_structure(b, vocab=1000)[0])  # verifies the plan
    assert plan.ops
