"""Compact and JSON job specs: accepted forms and every error message."""

import json

import pytest

from tenplex.frontends.parallel import Cluster, ParallelConfig
from tenplex.frontends.presets import preset
from tenplex.frontends.spec import job_from_spec, parse_spec, ptc_from_spec, spec_from_json
from tenplex.ir.errors import SpecError


def test_compact_spec_fields():
    job = parse_spec("llama-tiny:tp2,pp2,vpp2,zero1,sp@2x4")
    assert job.model == preset("llama-tiny")
    assert job.parallel == ParallelConfig(tp=2, pp=2, dp=2, vpp=2, zero=1, sp=True)
    assert job.cluster == Cluster(2, 4)


def test_dp_defaults_to_fill_and_first_host():
    job = parse_spec("gpt-tiny:tp2@2x4+3")
    assert (job.parallel.dp, job.cluster.first_device, job.cluster.first_host) == (4, 12, 3)


def test_model_overrides_and_aliases():
    job = parse_spec("gpt-tiny:tp1,layers=8,hidden=128,groups=2,ffn=512,dtype=float16,glu=true,noopt,first=3,pp2@1x2")
    m = job.model
    assert (m.num_layers, m.hidden, m.head_dim, m.query_groups, m.ffn_hidden, m.dtype, m.glu, m.optimizer) == (
        8,
        128,
        32,
        2,
        512,
        "float16",
        True,
        "none",
    )
    assert job.parallel.first == 3


def test_model_without_options():
    assert parse_spec("gpt-tiny@1x4").parallel == ParallelConfig(tp=1, pp=1, dp=4)


def test_ptc_from_spec_reference_examples():
    assert len(ptc_from_spec("gpt-1.3b:tp2,pp2,dp2@4x4").partitions) == 4
    assert sorted(ptc_from_spec("gpt-tiny:tp2,pp2,dp1@1x4+1").allocation.devices) == [4, 5, 6, 7]


ERRORS = {
    "gpt-tiny:tp3@1x4": "tp=3 does not divide heads=4",
    "gpt-tiny:tp2,foo@1x4": "option 'foo' is not one of tpN ppN dpN vppN epN zeroN sp noopt KEY=VALUE",
    "gpt-tiny:tp2": "missing '@HOSTSxGPUS' cluster part",
    "gpt-tiny:tp2@4": "cluster '4' is not HOSTSxGPUS or HOSTSxGPUS+FIRST_HOST",
    "nope:tp2@1x4": "unknown model preset 'nope' (known: ",
    "gpt-tiny:layers=x@1x4": "option 'layers=x': num_layers needs a non-negative integer, got 'x'",
    "gpt-tiny:color=red@1x4": "option 'color=red': unknown setting 'color'",
    "gpt-tiny:glu=maybe@1x4": "option 'glu=maybe': glu needs true or false, got 'maybe'",
    "gpt-tiny:pp2,stages=1/x@1x4": "option 'stages=1/x': stages needs a non-negative integer, got 'x'",
    "gpt-tiny:pp2,first=-1@1x4": "option 'first=-1': first needs a non-negative integer, got '-1'",
    "gpt-tiny:tp2,pp2,dp2@1x4": "tp*pp*dp = 2*2*2 = 8 ranks do not fit 4 devices (1 hosts x 4 GPUs)",
    "gpt-tiny:pp2,vpp4@1x4": "num_layers=4 is not divisible by pp*vpp=2*4",
    "gpt-tiny:zero2@1x4": "zero=2 must be 0 or 1 (1 = Megatron distributed optimizer)",
    "gpt-tiny:noopt,zero1@1x4": "zero=1 shards optimizer state, but the model has optimizer='none'",
    "moe-tiny:ep3@1x4": "ep=3 does not divide dp=4",
    "gpt-tiny:hidden=66@1x4": "model 'gpt-tiny': hidden=66 is not divisible by heads=4; give head_dim explicitly",
    "llama-tiny:pos=16@1x4": "model 'llama-tiny': a llama model uses RoPE",
}


@pytest.mark.parametrize("text", sorted(ERRORS))
def test_compact_spec_errors(text):
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    assert str(e.value).startswith(f"spec {text!r}: {ERRORS[text]}")


def test_json_spec_forms(tmp_path):
    doc = {
        "model": {"preset": "gpt-tiny", "num_layers": 8},
        "parallel": {"tp": 2, "pp": 2, "stage_layers": [5, 3]},
        "cluster": {"hosts": 1, "gpus_per_host": 8},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    job = job_from_spec(path)
    assert (job.model.num_layers, job.parallel.dp, job.parallel.stage_layers) == (8, 2, (5, 3))
    named = spec_from_json({"model": "llama-tiny", "parallel": {"tp": 2}, "cluster": {"hosts": 1, "gpus_per_host": 2}})
    assert (named.model, named.parallel.dp) == (preset("llama-tiny"), 1)
    fields = {
        "kind": "gpt",
        "num_layers": 2,
        "hidden": 32,
        "heads": 2,
        "ffn_hidden": 64,
        "vocab": 50,
        "max_position": 8,
    }
    assert (
        spec_from_json({"model": fields, "parallel": {}, "cluster": {"hosts": 1, "gpus_per_host": 1}}).model.head_dim
        == 16
    )
    ptc_from_spec(str(path)).check_complete()


JSON_ERRORS = {
    "top_key": (
        {"model": "gpt-tiny", "parallel": {}, "cluster": {}, "extra": 1},
        "job.json: unknown key 'extra' (allowed: model, parallel, cluster)",
    ),
    "model_type": (
        {"model": 3, "parallel": {}, "cluster": {}},
        "job.json: model: expected a preset name or an object, got 3",
    ),
    "preset": (
        {"model": {"preset": "gpt-9"}, "parallel": {}, "cluster": {}},
        "job.json: model.preset: unknown model preset 'gpt-9'",
    ),
    "model_field": (
        {"model": {"preset": "gpt-tiny", "layers": 2}, "parallel": {}, "cluster": {}},
        "job.json: model: unknown model field 'layers'",
    ),
    "model_missing": (
        {"model": {"kind": "gpt"}, "parallel": {}, "cluster": {}},
        "job.json: model: missing model field 'num_layers'",
    ),
    "model_value": (
        {"model": {"preset": "gpt-tiny", "heads": 3}, "parallel": {}, "cluster": {}},
        "job.json: model: hidden=64 is not divisible by heads=3",
    ),
    "parallel_value": (
        {"model": "gpt-tiny", "parallel": {"tp": "2"}, "cluster": {"hosts": 1, "gpus_per_host": 4}},
        "job.json: parallel: tp='2' must be an integer >= 1",
    ),
    "parallel_key": (
        {"model": "gpt-tiny", "parallel": {"mp": 2}, "cluster": {"hosts": 1, "gpus_per_host": 4}},
        "job.json: parallel: unknown key 'mp' (allowed: tp, pp, dp, vpp, zero, ep, sp, first, last, stage_layers, order)",
    ),
    "cluster_missing": ({"model": "gpt-tiny", "parallel": {}}, "job.json: cluster: expected an object, got None"),
    "cluster_value": (
        {"model": "gpt-tiny", "parallel": {}, "cluster": {"hosts": 0, "gpus_per_host": 4}},
        "job.json: cluster: hosts=0 must be an integer >= 1",
    ),
    "fit": (
        {"model": "gpt-tiny", "parallel": {"pp": 3}, "cluster": {"hosts": 1, "gpus_per_host": 4}},
        "job.json: num_layers=4 is not divisible by pp=3",
    ),
}


@pytest.mark.parametrize("name", sorted(JSON_ERRORS))
def test_json_spec_errors(name):
    doc, message = JSON_ERRORS[name]
    with pytest.raises(SpecError) as e:
        spec_from_json(doc, "job.json")
    assert str(e.value).startswith(message)


def test_json_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match=r"bad.json: not valid JSON"):
        job_from_spec(bad)
    with pytest.raises(SpecError, match=r"missing.json: cannot read: No such file or directory"):
        job_from_spec(tmp_path / "missing.json")
