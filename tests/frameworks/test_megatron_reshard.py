"""Round trips through the compiler: read A, compile A -> B, execute in-process, write B, read B;
every logical tensor equals the original, and A -> B -> A gives A's files back (RNG states,
re-derived, excepted). Then `reshard_megatron` end to end: in-process, atomic, and on two agent
processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.megatron.tree import build_tree
from tenplex.frameworks import CheckpointFormatError, reshard_megatron
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frameworks.megatron.write import write_megatron
from tenplex.frontends.spec import parse_spec
from tenplex.runtime.transport.ucx import ucx_available
from tests.frameworks.megatron_helpers import assert_truth, diff, load_tree, reshard

PAIRS = {  # name: (src spec, dst layout, builder options)
    "tp2pp2_to_tp4pp1": ("gpt-tiny:tp2,pp2@1x4", "tp=4,pp=1", {}),
    "tp1pp1_to_tp2pp2_tied_copy": ("gpt-tiny:tp1,pp1@1x1", "tp=2,pp=2", {}),
    "pp2_to_pp4_dp2": ("gpt-tiny:tp1,pp2,dp1@1x2", "tp=1,pp=4,dp=2", {}),
    "vpp2_to_tp2": ("gpt-tiny:tp1,pp2,vpp2@1x2", "tp=2,pp=1", {}),
    "uneven_to_even": ("gpt-tiny:tp2,pp2,first=1@1x4", "tp=1,pp=2", {}),
    "zero1_dp2_to_tp4_dp1": ("gpt-tiny:tp2,pp2,dp2,zero1@1x8", "tp=4,pp=1,dp=1", {}),
    "glu_gqa_untied_tp2_to_tp1pp4": ("llama-tiny:tp2,pp2@1x4", "tp=1,pp=4", {}),
    "mcore_te_zero1_to_tp1": ("llama-tiny:tp2,pp1,dp2,zero1@1x4", "tp=1,pp=2,dp=2", {"naming": "mcore-te"}),
    "vocab_repad_tp2_to_tp4": ("gpt-tiny:tp2,pp1,vocab=1100@1x2", "tp=4,pp=1", {}),
    "fp16_v2_groups": ("gpt-tiny:tp2,pp2,dtype=float16@1x4", "tp=1,pp=2", {"group_rule": "v2"}),
}


@pytest.fixture(scope="module", params=sorted(PAIRS))
def trip(request, tmp_path_factory):
    spec_text, layout, options = PAIRS[request.param]
    spec = parse_spec(spec_text)
    root = tmp_path_factory.mktemp(request.param)
    built = build_tree(root / "a", spec.model, spec.parallel, **options)
    src = read_megatron(root / "a")
    write_megatron(*reshard(src, layout), root / "b")
    back = read_megatron(root / "b")
    write_megatron(*reshard(back, src.meta.parallel), root / "c")
    return built, src, back, root


@pytest.mark.timeout(60)
def test_logical_tensors_survive(trip):
    built, _, back, _ = trip
    assert_truth(back.ptc, back.arrays, built.truth)


@pytest.mark.timeout(60)
def test_there_and_back_is_byte_identical(trip):
    _, _, _, root = trip
    assert diff(load_tree(root / "a"), load_tree(root / "c")) == []


@pytest.mark.timeout(60)
def test_target_files_describe_the_target(trip):
    _, src, back, root = trip
    files = load_tree(root / "b")
    par = back.meta.parallel
    model_files = [k for k in files if k.endswith("model_optim_rng.pt")]
    assert len(model_files) == par.tp * par.pp
    for name in model_files:
        args = files[name]["args"]
        assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (par.tp, par.pp)
        assert args.data_parallel_size == par.dp and args.world_size == par.tp * par.pp * par.dp
        assert files[name]["iteration"] == 100
        assert files[name]["opt_param_scheduler"] == load_tree(root / "a")[_first(root / "a")]["opt_param_scheduler"]
    assert (files[model_files[0]]["args"].virtual_pipeline_model_parallel_size or 1) == par.vpp
    assert src.meta.model == back.meta.model


def _first(root: Path) -> str:
    return str(sorted(root.rglob("model_optim_rng.pt"))[0].relative_to(root))


@pytest.mark.timeout(60)
def test_zero_change_keeps_every_tensor(tmp_path):
    """Distributed optimizer <-> plain optimizer: the fragments become per-parameter state and back."""
    spec = parse_spec("gpt-tiny:tp2,pp2,dp2,zero1@1x8")
    built = build_tree(tmp_path / "a", spec.model, spec.parallel)
    src = read_megatron(tmp_path / "a")
    write_megatron(*reshard(src, "tp=2,pp=2,dp=2,zero=0"), tmp_path / "b")
    plain = read_megatron(tmp_path / "b")
    assert not plain.meta.parallel.zero and not list((tmp_path / "b").rglob("distrib_optim.pt"))
    assert_truth(plain.ptc, plain.arrays, built.truth)
    write_megatron(*reshard(plain, "tp=1,pp=1,dp=4,zero=1"), tmp_path / "c")
    assert_truth(read_megatron(tmp_path / "c").ptc, read_megatron(tmp_path / "c").arrays, built.truth)


@pytest.mark.timeout(60)
def test_reshard_megatron_in_process(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp2,dp2,zero1@1x8")
    built = build_tree(tmp_path / "a", spec.model, spec.parallel)
    result = reshard_megatron(tmp_path / "a", "tp=4,pp=1", tmp_path / "b")
    assert (result.src, result.dst) == ("tp2,pp2,dp2,zero1", "tp4,pp1,dp2,zero1")
    assert result.bytes_moved > 0
    out = read_megatron(tmp_path / "b")
    assert_truth(out.ptc, out.arrays, built.truth)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.tmp-")]


@pytest.mark.timeout(60)
def test_reshard_megatron_refuses_an_existing_output(tmp_path):
    spec = parse_spec("gpt-tiny:tp1,pp1@1x1")
    build_tree(tmp_path / "a", spec.model, spec.parallel)
    (tmp_path / "b").mkdir()
    with pytest.raises(CheckpointFormatError, match="already exists"):
        reshard_megatron(tmp_path / "a", "tp=2,pp=1", tmp_path / "b")


@pytest.mark.timeout(60)
def test_nothing_is_written_on_error(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp1@1x2")
    build_tree(tmp_path / "a", spec.model, spec.parallel)
    ptc, arrays, values = ckpt = read_megatron(tmp_path / "a")
    missing = dict(arrays)
    missing.pop(sorted(missing)[-1])
    with pytest.raises(CheckpointFormatError, match="no array"):
        write_megatron(ptc, missing, values, ckpt.meta, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(ucx_available() is not None, reason=f"ucxx cannot be imported: {ucx_available()}")
def test_reshard_megatron_on_two_workers(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp2@1x4")
    built = build_tree(tmp_path / "a", spec.model, spec.parallel)
    reshard_megatron(tmp_path / "a", "tp=1,pp=4", tmp_path / "b", workers=2, timeout=20.0)
    out = read_megatron(tmp_path / "b")
    assert_truth(out.ptc, out.arrays, built.truth)
