"""read_megatron on trees built the way Megatron writes them: the PTC is the frontend's for that
job, every logical tensor equals the builder's, and read -> write -> read is the identity (arrays
bit for bit, files equal key for key). One named case per format feature."""

from __future__ import annotations

import pytest

from fixtures.megatron.tree import build_tree
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frameworks.megatron.write import write_megatron
from tenplex.frontends.spec import parse_spec
from tests.frameworks.megatron_helpers import assert_truth, diff, load_tree

CASES = {  # name: (compact spec, builder options)
    "legacy_tp2_pp2": ("gpt-tiny:tp2,pp2@1x4", {}),
    "legacy_zero1_dp2": ("gpt-tiny:tp2,pp2,dp2,zero1@1x8", {}),
    "legacy_vpp2": ("gpt-tiny:tp1,pp2,vpp2@1x2", {}),
    "legacy_uneven_first1": ("gpt-tiny:tp2,pp2,first=1@1x4", {}),
    "llama_glu_gqa_untied": ("llama-tiny:tp2,pp2@1x4", {}),
    "llama_zero1_dp2": ("llama-tiny:tp2,pp1,dp2,zero1@1x4", {}),
    "mcore_local": ("gpt-tiny:tp2,pp2@1x4", {"naming": "mcore"}),
    "mcore_te_zero1": ("llama-tiny:tp2,pp2,zero1@1x4", {"naming": "mcore-te"}),
    "fp16_grad_scaler": ("gpt-tiny:tp2,pp2,dtype=float16@1x4", {}),
    "fp32_zero1": ("gpt-tiny:tp2,pp1,dp2,zero1,dtype=float32@1x4", {}),
    "fp32_plain": ("gpt-tiny:tp1,pp2,dtype=float32@1x2", {}),
    "release": ("gpt-tiny:tp2,pp1@1x2", {"release": True}),
    "v2_groups_chained": ("gpt-tiny:tp1,pp2@1x2", {"group_rule": "v2", "chained": True}),
    "no_optimizer": ("gpt-tiny:tp2,pp2,noopt@1x4", {"optimizer": False}),
    "buckets_split": ("gpt-tiny:tp1,pp2,dp4,zero1@1x8", {"args": {"overlap_grad_reduce": True, "ddp_bucket_size": 5000}}),
    "untied_vocab_padding": ("gpt-tiny:tp4,pp1,tied=false,vocab=1100@1x4", {"pad_value": 0.0}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    spec_text, options = CASES[request.param]
    spec = parse_spec(spec_text)
    root = tmp_path_factory.mktemp(request.param) / "ckpt"
    built = build_tree(root, spec.model, spec.parallel, **options)
    return spec, built, read_megatron(root)


@pytest.mark.timeout(60)
def test_ptc_is_the_frontends(case):
    spec, _, ckpt = case
    assert ckpt.ptc == spec.build()
    assert ckpt.meta.model == spec.model and ckpt.meta.parallel == spec.parallel


@pytest.mark.timeout(60)
def test_logical_tensors_equal_the_builders(case):
    _, built, ckpt = case
    assert_truth(ckpt.ptc, ckpt.arrays, built.truth)


@pytest.mark.timeout(60)
def test_values_carry_iteration_and_rng_offsets(case):
    _, _, ckpt = case
    for part in ckpt.ptc.partitions:
        if "rng" in part.value_map:
            assert ckpt.values[part.id] == {"iteration": 100, "rng": part.value_map["rng"].value}
        else:
            assert ckpt.values[part.id] == {}


@pytest.mark.timeout(60)
def test_read_write_read_is_identity(case, tmp_path):
    _, built, ckpt = case
    write_megatron(*ckpt, ckpt.meta, tmp_path / "again")
    again = read_megatron(tmp_path / "again")
    assert again.ptc == ckpt.ptc and again.values == ckpt.values
    assert {k: a.tobytes() for k, a in again.arrays.items()} == {k: a.tobytes() for k, a in ckpt.arrays.items()}
    assert diff(load_tree(built.root), load_tree(tmp_path / "again")) == []


def test_unpacks_as_the_triple(case):
    _, _, ckpt = case
    ptc, arrays, values = ckpt
    assert (ptc, arrays, values) == (ckpt.ptc, ckpt.arrays, ckpt.values)


@pytest.mark.parametrize("version", [0, 1.0])
def test_old_qkv_layouts_read_as_grouped(version, tmp_path):
    """checkpoint_version 0 ([Q_r; K_r; V_r]) and 1.0 ([np_r, hn, 3]) per rank, weights and Adam
    state alike, read as the grouped layout; the writer then writes version 3.0."""
    spec = parse_spec("gpt-tiny:tp2,pp1@1x2")
    built = build_tree(tmp_path / "old", spec.model, spec.parallel, version=version)
    ckpt = read_megatron(tmp_path / "old")
    assert_truth(ckpt.ptc, ckpt.arrays, built.truth)
    write_megatron(*ckpt, ckpt.meta, tmp_path / "new")
    assert load_tree(tmp_path / "new")["iter_0000100/mp_rank_00/model_optim_rng.pt"]["checkpoint_version"] == 3.0
    assert_truth(ckpt.ptc, read_megatron(tmp_path / "new").arrays, built.truth)


def test_true_vocab_size_from_the_caller(tmp_path):
    """Without args.vocab_size every padded row is data; `vocab=` strips the padding again."""
    spec = parse_spec("gpt-tiny:tp2,pp1,vocab=1100@1x2")
    build_tree(tmp_path / "a", spec.model, spec.parallel, args={"vocab_size": None})
    assert read_megatron(tmp_path / "a").meta.model.vocab == 1280
    assert read_megatron(tmp_path / "a", vocab=1100).ptc == spec.build()
