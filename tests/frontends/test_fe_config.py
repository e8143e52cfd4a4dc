"""ModelSpec, presets, ParallelConfig, Cluster, fit and pipeline placement."""

import math

import pytest

from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import Cluster, ParallelConfig, fit
from tenplex.frontends.params import chunk_params
from tenplex.frontends.pipeline import chunks, stage_layer_counts
from tenplex.frontends.presets import PRESETS, preset
from tenplex.ir.errors import SpecError


def total_params(name):
    model = preset(name)
    whole = chunks(model.num_layers, ParallelConfig())[0]
    return sum(math.prod(p.shape) for p in chunk_params(model, whole, 1, range(model.num_experts)))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build(name):
    assert preset(name).num_layers == PRESETS[name]["num_layers"]


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("llama-7b", 6_738_415_616),
        ("llama-70b", 68_976_648_192),
        ("gpt-1.3b", 1_315_723_264),
        ("gpt-175b", 174_604_259_328),
        ("bert-large", 336_226_108),
    ],
)
def test_preset_parameter_counts(name, count):
    # Llama: the published Hugging Face counts. GPT: 12·L·h² + 13·L·h + (V + pos)·h + 2·h.
    assert total_params(name) == count


def test_gqa_qkv_rows_and_head_dim_default():
    model = preset("llama-70b")
    assert (model.head_dim, model.query_groups, model.qkv_rows) == (128, 8, (64 + 16) * 128)
    assert preset("gpt-tiny", hidden=128).head_dim == 32  # re-derived from the override


MODEL_ERRORS = {
    "bad_kind": (dict(kind="t5"), "model kind='t5' is not one of ['gpt', 'bert', 'llama']"),
    "groups": (dict(query_groups=3), "heads=4 is not a multiple of query_groups=3"),
    "hidden_heads": (dict(hidden=66), "hidden=66 is not divisible by heads=4; give head_dim explicitly"),
    "negative": (dict(num_layers=0), "model num_layers=0 must be an integer >= 1"),
    "dtype": (dict(dtype="int8"), "model dtype='int8' is not one of"),
    "no_pos": (dict(max_position=0), "a gpt model needs learned position embeddings: max_position=0 must be > 0"),
    "glu_type": (dict(glu="yes"), "model glu='yes' is not a boolean"),
}


@pytest.mark.parametrize("name", sorted(MODEL_ERRORS))
def test_model_errors(name):
    fields, message = MODEL_ERRORS[name]
    with pytest.raises(SpecError) as e:
        ModelSpec(**{**PRESETS["gpt-tiny"], **fields})
    assert str(e.value).startswith(message)


def test_llama_has_no_position_embeddings():
    with pytest.raises(
        SpecError, match="a llama model uses RoPE and has no position embeddings: max_position=16 must be 0"
    ):
        preset("llama-tiny", max_position=16)


def test_unknown_preset():
    with pytest.raises(SpecError, match="unknown model preset 'gpt-9'"):
        preset("gpt-9")


PARALLEL_ERRORS = {
    "tp0": (dict(tp=0), "tp=0 must be an integer >= 1"),
    "zero2": (dict(zero=2), "zero=2 must be 0 or 1 (1 = Megatron distributed optimizer)"),
    "vpp_no_pp": (dict(vpp=2), "vpp=2 needs pp > 1, got pp=1"),
    "first_no_pp": (dict(first=1), "first=1, last=None need pp > 1, got pp=1"),
    "both_splits": (
        dict(pp=2, first=1, stage_layers=(1, 3)),
        "give either first/last stage layer counts or stage_layers, not both",
    ),
    "stage_count": (dict(pp=3, stage_layers=(1, 3)), "stage_layers=[1, 3] has 2 stages but pp=3"),
    "vpp_uneven": (dict(pp=2, vpp=2, last=1), "vpp=2 is supported only with an even layer split"),
}


@pytest.mark.parametrize("name", sorted(PARALLEL_ERRORS))
def test_parallel_errors(name):
    kwargs, message = PARALLEL_ERRORS[name]
    with pytest.raises(SpecError) as e:
        ParallelConfig(**kwargs)
    assert str(e.value) == message


FIT_ERRORS = {
    "tp_heads": ("gpt-tiny", {}, dict(tp=8), "tp=8 does not divide heads=4"),
    "tp_groups": (
        "llama-tiny",
        dict(heads=12, query_groups=6, hidden=96),
        dict(tp=4),
        "tp=4 does not divide query_groups=6 (tp > query_groups needs tp to divide the 192 QKV rows)",
    ),
    "tp_over_groups_rows": (
        "llama-tiny",
        dict(hidden=4, query_groups=1, ffn_hidden=8),
        dict(tp=4),
        "tp=4 does not divide query_groups=1 (tp > query_groups needs tp to divide the 6 QKV rows)",
    ),
    "ffn": ("gpt-tiny", dict(ffn_hidden=102), dict(tp=4), "tp=4 does not divide ffn_hidden=102"),
    "layers_pp": ("gpt-tiny", {}, dict(pp=3), "num_layers=4 is not divisible by pp=3"),
    "layers_vpp": ("gpt-tiny", {}, dict(pp=2, vpp=4), "num_layers=4 is not divisible by pp*vpp=2*4"),
    "uneven_rest": (
        "gpt-tiny",
        dict(num_layers=8),
        dict(pp=4, first=1),
        "num_layers=8 minus first=1, last=None leaves 7 layers, which do not split evenly over the other 3 stages",
    ),
    "uneven_negative": (
        "gpt-tiny",
        {},
        dict(pp=2, first=3, last=2),
        "num_layers=4 minus first=3, last=2 leaves -1 layers",
    ),
    "stage_sum": ("gpt-tiny", {}, dict(pp=2, stage_layers=(1, 2)), "stage_layers=[1, 2] sum to 3, not num_layers=4"),
    "fits": (
        "gpt-tiny",
        {},
        dict(tp=2, pp=2, dp=3),
        "tp*pp*dp = 2*2*3 = 12 ranks do not fit 8 devices (2 hosts x 4 GPUs)",
    ),
    "fits_no_dp": ("gpt-tiny", {}, dict(tp=4, pp=4), "tp*pp = 4*4 = 16 ranks do not fit 8 devices (2 hosts x 4 GPUs)"),
    "ep_dense": ("gpt-tiny", {}, dict(ep=2), "ep=2 needs a mixture-of-experts model, but num_experts=0"),
    "ep_dp": ("moe-tiny", {}, dict(ep=2, dp=3), "ep=2 does not divide dp=3"),
    "ep_experts": ("moe-tiny", {}, dict(ep=8), "ep=8 does not divide num_experts=4"),
    "zero_noopt": (
        "gpt-tiny",
        dict(optimizer="none"),
        dict(zero=1),
        "zero=1 shards optimizer state, but the model has optimizer='none'",
    ),
}


@pytest.mark.parametrize("name", sorted(FIT_ERRORS))
def test_fit_errors(name):
    model, fields, kwargs, message = FIT_ERRORS[name]
    with pytest.raises(SpecError) as e:
        fit(preset(model, **fields), ParallelConfig(**kwargs), Cluster(2, 4))
    assert str(e.value).startswith(message)


def test_tp_above_query_groups_allowed_when_rows_divide():
    model = preset("llama-tiny")  # heads 4, groups 2: 128 QKV rows
    assert fit(model, ParallelConfig(tp=4), Cluster(1, 4)).dp == 1


def test_dp_fills_the_cluster():
    assert fit(preset("gpt-tiny"), ParallelConfig(tp=2, pp=2), Cluster(4, 4)).dp == 4


def test_rank_order_tp_fastest_then_dp_then_pp():
    par = ParallelConfig(tp=2, pp=2, dp=2)
    assert [par.rank(p, d, t) for p in range(2) for d in range(2) for t in range(2)] == list(range(8))
    assert par.rank(1, 0, 1) == 5


def test_cluster_devices_and_hosts():
    topo = Cluster(2, 4, first_host=1).topology()
    assert [(d.id, d.host) for d in topo.devices] == [
        (4, "h1"),
        (5, "h1"),
        (6, "h1"),
        (7, "h1"),
        (8, "h2"),
        (9, "h2"),
        (10, "h2"),
        (11, "h2"),
    ]
    assert Cluster(1, 4, first_device=2).device(1) == 3


def spans(num_layers, **kwargs):
    return {(c.pp, c.vp): (c.start, c.stop, c.prefix) for c in chunks(num_layers, ParallelConfig(**kwargs))}


def test_vpp_table_l8_p2_v2():
    assert spans(8, pp=2, vpp=2) == {
        (0, 0): (0, 2, "model0"),
        (1, 0): (2, 4, "model0"),
        (0, 1): (4, 6, "model1"),
        (1, 1): (6, 8, "model1"),
    }


def test_vpp_l8_p2_v4():
    table = spans(8, pp=2, vpp=4)
    assert [table[0, v][:2] for v in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [table[1, v][:2] for v in range(4)] == [(1, 2), (3, 4), (5, 6), (7, 8)]


def test_first_and_last_chunk_flags():
    cs = chunks(8, ParallelConfig(pp=2, vpp=2))
    assert [(c.pp, c.vp) for c in cs if c.first] == [(0, 0)]
    assert [(c.pp, c.vp) for c in cs if c.last] == [(1, 1)]


@pytest.mark.parametrize(
    ("kwargs", "counts"),
    [
        (dict(pp=4), (6, 6, 6, 6)),
        (dict(pp=4, first=3, last=3), (3, 9, 9, 3)),
        (dict(pp=3, first=2), (2, 11, 11)),
        (dict(pp=3, last=0), (12, 12, 0)),
        (dict(pp=3, stage_layers=(10, 10, 4)), (10, 10, 4)),
    ],
)
def test_stage_layer_counts(kwargs, counts):
    par = ParallelConfig(**kwargs)
    assert stage_layer_counts(24, par) == counts
    assert [c.stop - c.start for c in chunks(24, par)] == list(counts)
    assert chunks(24, par)[-1].stop == 24


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("gpt-tiny", "tp2,pp2,dp2"),
        ("gpt-tiny", "tp1,pp4,dp1,vpp2,zero1,sp"),
        ("moe-tiny", "tp1,pp2,dp2,ep2"),
        ("gpt-tiny", "tp1,pp3,dp1,first=1,last=2"),
        ("gpt-tiny", "tp1,pp2,dp1,stages=3/5"),
    ],
)
def test_parallel_printer_round_trips(model, options):
    from tenplex.frontends.spec import parse_spec

    assert str(parse_spec(f"{model}:{options},layers=8@2x4").parallel) == options
