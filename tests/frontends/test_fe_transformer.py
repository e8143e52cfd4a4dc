"""build_ptc: the Tenplex reference's checkable behaviours (docs/reference-tenplex.md §9) and
Megatron's conventions, asserted on built PTCs."""

import math
import re
import time

import pytest

from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.box import Box, disjoint_union
from tenplex.ir.serialize import dumps, loads

H = 1536  # GPT-large hidden


def sub(ptc, sid):
    return ptc.subtensor_map[sid]


def holders(ptc, tensor):
    return sorted(st.id for st in ptc.by_tensor[tensor])


@pytest.fixture(scope="module")
def large():
    return {tp: ptc_from_spec(f"gpt-large:tp{tp},pp2,dp1@1x{2 * tp}") for tp in (1, 2, 4, 8)}


@pytest.mark.parametrize(("tp", "rows"), [(1, 50304), (2, 25216), (4, 12672), (8, 6400)])
def test_vocab_padded_rows_per_rank(large, tp, rows):  # §9.5
    for t in range(tp):
        assert sub(large[tp], f"pp0-tp{t}/embedding.word_embeddings.weight").shape == (rows, H)
        assert sub(large[tp], f"pp1-tp{t}/word_embeddings_for_head.weight").shape == (rows, H)


def test_embedding_tp2_rank1_rows_and_fill(large):  # §9.5
    st = sub(large[2], "pp0-tp1/embedding.word_embeddings.weight")
    assert [(p.global_box, p.local_box) for p in st.pieces] == [(Box((25216, 0), (50257, H)), Box((0, 0), (25041, H)))]
    assert st.fill_boxes() == [Box((25041, 0), (25216, H))]  # 175 padding rows


def test_embedding_tp4_reference_cases(large):  # §9.5: TP2->TP4 rank 1 and rank 3 by global rows
    r1 = sub(large[4], "pp0-tp1/embedding.word_embeddings.weight").pieces[0].global_box
    assert (r1.start[0], r1.stop[0]) == (12672, 25344)  # src0[12672:25216] ++ src1[0:128]
    r3 = sub(large[4], "pp0-tp3/embedding.word_embeddings.weight")
    assert r3.pieces[0].global_box.start[0] == 38016 and r3.fill_boxes()[0].shape == (12672 - 12241, H)


@pytest.mark.parametrize(("tp", "rows"), [(1, 4608), (2, 2304), (4, 1152), (8, 576)])
def test_qkv_per_rank(large, tp, rows):  # §9.6
    for t in range(tp):
        w = sub(large[tp], f"pp0-tp{t}/layers.0.self_attention.linear_qkv.weight")
        b = sub(large[tp], f"pp0-tp{t}/layers.0.self_attention.linear_qkv.bias")
        assert (w.shape, b.shape) == ((rows, H), (rows,))
        assert w.pieces[0].global_box == Box((t * rows, 0), ((t + 1) * rows, H))


@pytest.mark.parametrize(
    ("tp", "fc1", "proj", "fc2"), [(2, (3072, H), (H, 768), (H, 3072)), (4, (1536, H), (H, 384), (H, 1536))]
)
def test_column_and_row_parallel_shapes(large, tp, fc1, proj, fc2):  # §9.7, §9.8
    ptc = large[tp]
    assert sub(ptc, "pp0-tp1/layers.3.mlp.fc1.weight").shape == fc1
    assert sub(ptc, "pp0-tp1/layers.3.mlp.fc1.weight").pieces[0].global_box == Box((fc1[0], 0), (2 * fc1[0], H))
    assert sub(ptc, "pp0-tp1/layers.3.self_attention.linear_proj.weight").shape == proj
    assert sub(ptc, "pp0-tp1/layers.3.self_attention.linear_proj.weight").pieces[0].global_box == Box(
        (0, proj[1]), (H, 2 * proj[1])
    )
    assert sub(ptc, "pp0-tp1/layers.3.mlp.fc2.weight").shape == fc2


REPLICATED = [
    "layers.0.input_norm.weight", "layers.0.input_norm.bias", "layers.0.self_attention.linear_proj.bias",
    "layers.0.pre_mlp_norm.weight", "layers.0.mlp.fc2.bias", "embedding.position_embeddings.weight",
]  # fmt: skip


@pytest.mark.parametrize("name", REPLICATED)
def test_replicated_tensors_whole_on_every_rank(large, name):  # §9.9
    ptc = large[4]
    meta = ptc.tensor_map[name]
    assert len(holders(ptc, name)) == 4
    for st in ptc.by_tensor[name]:
        assert st.shape == meta.shape and [p.global_box for p in st.pieces] == [meta.box]


def test_bert_heads_on_last_stage():  # §9.4, §9.9
    ptc = ptc_from_spec("bert-large:tp2,pp2,dp1@1x4")
    assert sub(ptc, "pp1-tp1/lm_head.bias").shape == (15360,)
    assert sub(ptc, "pp1-tp1/lm_head.bias").path == "model/lm_head/bias"
    for name in (
        "pooler.dense.weight",
        "lm_head.dense.weight",
        "lm_head.norm.bias",
        "binary_head.weight",
        "final_norm.weight",
    ):
        assert holders(ptc, name) == [f"pp1-tp0/{name}", f"pp1-tp1/{name}"]
        assert sub(ptc, f"pp1-tp0/{name}").shape == ptc.tensor_map[name].shape
    assert holders(ptc, "embedding.tokentype_embeddings.weight") == [
        "pp0-tp0/embedding.tokentype_embeddings.weight",
        "pp0-tp1/embedding.tokentype_embeddings.weight",
    ]


def layer_map(ptc, pp):
    """Global layer -> local index on each stage, from the sub-tensor paths."""
    out = {}
    for st in ptc.subtensors:
        m = re.fullmatch(r"pp(\d+)-tp0/layers\.(\d+)\.input_norm\.weight", st.id)
        if m and int(m[1]) == pp:
            out[int(m[2])] = int(re.search(r"layers\.(\d+)\.", st.path)[1])
    return out


def test_layer_renumbering_pp2_vs_pp4():  # §9.3
    pp2 = ptc_from_spec("gpt-large:tp1,pp2,dp1@1x2")
    pp4 = ptc_from_spec("gpt-large:tp1,pp4,dp1@1x4")
    for s in range(4):
        assert layer_map(pp4, s) == {6 * s + j: j for j in range(6)}
    assert layer_map(pp2, 1) == {12 + j: j for j in range(12)}
    # target (pp 3, layers.0) holds global layer 18, which source (pp 1, layers.6) holds
    assert layer_map(pp4, 3)[18] == 0 and layer_map(pp2, 1)[18] == 6
    assert (
        sub(pp4, "pp3-tp0/layers.18.mlp.fc1.weight").path
        == "model/language_model/encoder/layers.0.mlp.dense_h_to_4h.weight"
    )


def test_stage_placement_and_tied_copy(large):  # §9.4
    ptc = large[2]
    assert holders(ptc, "embedding.position_embeddings.weight") == [
        "pp0-tp0/embedding.position_embeddings.weight",
        "pp0-tp1/embedding.position_embeddings.weight",
    ]
    assert holders(ptc, "final_norm.bias") == ["pp1-tp0/final_norm.bias", "pp1-tp1/final_norm.bias"]
    head = sub(ptc, "pp1-tp1/word_embeddings_for_head.weight")
    assert (head.tensor, head.path) == ("embedding.word_embeddings.weight", "model/word_embeddings_for_head/weight")
    assert head.pieces == sub(ptc, "pp0-tp1/embedding.word_embeddings.weight").pieces
    state = sub(ptc, "pp1-tp1/optim.exp_avg/word_embeddings_for_head.weight")
    assert (state.tensor, state.path) == (
        "optim.exp_avg/embedding.word_embeddings.weight",
        "optimizer/state/word_embeddings_for_head.weight/exp_avg",
    )
    assert "output_layer.weight" not in ptc.tensor_map


def test_no_tied_copy_with_pp1():
    ptc = ptc_from_spec("gpt-large:tp2,pp1,dp1@1x2")
    assert holders(ptc, "embedding.word_embeddings.weight") == [
        "pp0-tp0/embedding.word_embeddings.weight",
        "pp0-tp1/embedding.word_embeddings.weight",
    ]


def test_untied_output_layer_llama():
    ptc = ptc_from_spec("llama-tiny:tp2,pp2,dp1@1x4")
    assert holders(ptc, "output_layer.weight") == ["pp1-tp0/output_layer.weight", "pp1-tp1/output_layer.weight"]
    assert len(holders(ptc, "embedding.word_embeddings.weight")) == 2
    assert not any(name.endswith(".bias") for name in ptc.tensor_map)
    assert "embedding.position_embeddings.weight" not in ptc.tensor_map


def test_gqa_qkv_rows_and_glu_halves():
    ptc = ptc_from_spec("llama-tiny:tp2,pp1,dp1@1x2")  # heads 4, groups 2, hn 16, f 128
    qkv = sub(ptc, "pp0-tp1/layers.0.self_attention.linear_qkv.weight")
    assert ptc.tensor_map[qkv.tensor].shape == (128, 64)
    assert [p.global_box for p in qkv.pieces] == [Box((64, 0), (128, 64))]  # query group 1 block
    fc1 = sub(ptc, "pp0-tp1/layers.0.mlp.fc1.weight")
    assert fc1.shape == (128, 64)
    assert [(p.global_box, p.local_box) for p in fc1.pieces] == [
        (Box((64, 0), (128, 64)), Box((0, 0), (64, 64))),  # gate W_1
        (Box((192, 0), (256, 64)), Box((64, 0), (128, 64))),  # up V_1
    ]


def test_vpp_paths_and_chunks():
    ptc = ptc_from_spec("gpt-tiny:tp1,pp2,dp1,vpp2,layers=8@1x2")
    assert (
        sub(ptc, "pp1-tp0/layers.7.input_norm.weight").path
        == "model1/language_model/encoder/layers.1.input_norm.weight"
    )
    assert (
        sub(ptc, "pp0-tp0/layers.4.input_norm.weight").path
        == "model1/language_model/encoder/layers.0.input_norm.weight"
    )
    assert (
        sub(ptc, "pp1-tp0/layers.2.input_norm.weight").path
        == "model0/language_model/encoder/layers.0.input_norm.weight"
    )
    assert (
        sub(ptc, "pp0-tp0/embedding.word_embeddings.weight").path
        == "model0/language_model/embedding/word_embeddings/weight"
    )
    assert sub(ptc, "pp1-tp0/word_embeddings_for_head.weight").path == "model1/word_embeddings_for_head/weight"


def test_uneven_pipeline():
    ptc = ptc_from_spec("gpt-tiny:tp1,pp3,dp1,first=2,last=2,layers=8@1x3")
    assert [sorted(layer_map(ptc, s)) for s in range(3)] == [[0, 1], [2, 3, 4, 5], [6, 7]]
    assert layer_map(ptc, 2) == {6: 0, 7: 1}


def test_megatron_param_group_sizes():  # §9.13: 2-D non-bias params vs biases and 1-D params
    def groups(spec, pp):
        ptc = ptc_from_spec(spec)
        params = [st for st in ptc.subtensors if st.id.startswith(f"pp{pp}-tp0/") and "optim." not in st.id]
        two_d = sum(len(ptc.tensor_map[st.tensor].shape) == 2 and not st.tensor.endswith(".bias") for st in params)
        return two_d, len(params) - two_d

    assert groups("gpt-large:tp1,pp1,dp1@1x1", 0) == (98, 194)
    assert groups("gpt-large:tp1,pp2,dp1@1x2", 0) == (50, 96)
    assert groups("gpt-large:tp1,pp2,dp1@1x2", 1) == (49, 98)
    assert groups("gpt-large:tp1,pp4,dp1@1x4", 0) == (26, 48)


def test_rank_order_allocation_and_values():  # §9.1
    ptc = ptc_from_spec("gpt-1.3b:tp2,pp2,dp2@4x4")
    assert dict(ptc.allocation.items) == {"pp0-tp0": (0, 2), "pp0-tp1": (1, 3), "pp1-tp0": (4, 6), "pp1-tp1": (5, 7)}
    assert [ptc.topology.host_of(d) for d in (3, 4)] == ["h0", "h1"]
    values = ptc.partition_map["pp1-tp1"].value_map
    assert values["rng"].value == {"seed_offset": 100, "model_parallel_seed_offset": 2719}
    assert values["rng"].policy == "per-rank" and values["iteration"].value is None


def test_redeployment_to_other_hosts():
    ptc = ptc_from_spec("gpt-tiny:tp2,pp2,dp1@1x4+1")
    assert dict(ptc.allocation.items) == {"pp0-tp0": (4,), "pp0-tp1": (5,), "pp1-tp0": (6,), "pp1-tp1": (7,)}
    assert ptc.topology.hosts == ("h1",)


def test_dtypes_and_noopt():
    ptc = ptc_from_spec("gpt-tiny:tp1,pp1,dp1@1x1")
    assert ptc.tensor_map["layers.0.mlp.fc1.weight"].dtype == "bfloat16"
    assert ptc.tensor_map["optim.exp_avg_sq/layers.0.mlp.fc1.weight"].dtype == "float32"
    assert (
        sub(ptc, "pp0-tp0/optim.fp32_param/layers.0.mlp.fc1.weight").path
        == "optimizer/fp32_from_fp16_params/layers.0.mlp.fc1.weight"
    )
    assert ptc_from_spec("gpt-large:tp1,pp1,dp1@1x1").tensor_map["final_norm.weight"].dtype == "float16"
    assert not any(t.startswith("optim.") for t in ptc_from_spec("gpt-tiny:tp1,noopt@1x1").tensor_map)
    fp32 = ptc_from_spec("gpt-tiny:tp1,dtype=float32@1x1").tensor_map
    assert "optim.exp_avg/final_norm.weight" in fp32 and "optim.fp32_param/final_norm.weight" not in fp32


def test_expert_parallel_placement():
    ptc = ptc_from_spec("moe-tiny:tp1,pp1,dp4,ep2@1x4")
    assert dict(ptc.allocation.items) == {"pp0-tp0-ep0": (0, 2), "pp0-tp0-ep1": (1, 3)}
    assert holders(ptc, "layers.1.mlp.experts.3.fc1.weight") == ["pp0-tp0-ep1/layers.1.mlp.experts.3.fc1.weight"]
    assert (
        sub(ptc, "pp0-tp0-ep1/layers.1.mlp.experts.3.fc1.weight").path
        == "model/language_model/encoder/layers.1.mlp.local_experts.1.dense_h_to_4h.weight"
    )
    assert len(holders(ptc, "layers.1.mlp.router.weight")) == 2
    assert ptc.partition_map["pp0-tp0-ep1"].value_map["rng"].value["expert_parallel_seed_offset"] == 1124


ZERO_SPECS = [
    "llama-tiny:tp2,pp2,vpp2,zero1@2x4",
    "gpt-tiny:tp2,pp2,dp3,zero1@2x8",
    "moe-tiny:tp2,pp1,dp4,ep2,zero1@1x8",
    "bert-tiny:tp2,pp2,dp2,zero1@1x8",
]


@pytest.mark.parametrize("spec", ZERO_SPECS)
def test_zero_fragments_cover_the_tp_pieces_exactly(spec):
    ptc = ptc_from_spec(spec)
    params = {}  # (tp partition prefix, label) -> global boxes the TP rank holds
    frags = {}  # (tp partition prefix, optim tensor, label) -> fragment global boxes over DP ranks
    for st in ptc.subtensors:
        pid, rest = st.id.split("/", 1)
        if re.fullmatch(r"pp\d+-tp\d+(-ep\d+)?", pid):
            assert not rest.startswith("optim.")  # zero=1: no Adam state in the model partitions
            params[re.sub(r"-ep\d+", "", pid), rest] = [p.global_box for p in st.pieces]
        else:
            assert len(ptc.allocation.devices_of(pid)) == 1
            kind, label = rest.split("/", 1)
            frags.setdefault((pid.rsplit("-dp", 1)[0], kind, label), []).extend(p.global_box for p in st.pieces)
    assert frags
    for (tp_pid, _, label), boxes in frags.items():
        want = params[tp_pid, label]
        assert sum(b.volume for b in boxes) == sum(b.volume for b in want)  # no overlaps
        assert sum(b.volume for b in disjoint_union(boxes + want)) == sum(b.volume for b in want)  # same region


def test_zero_fragment_layout_of_a_small_stage():
    ptc = ptc_from_spec("gpt-tiny:tp1,pp1,dp2,zero1,layers=1,vocab=100,pos=4@1x2")
    # named order: word [100,64] (local 128x64 padded), pos [4,64], layer 0 (12 params), final norm
    # reversed, 64-aligned: final_norm.bias at 0, final_norm.weight at 64, ..., word embedding last
    st = sub(ptc, "pp0-tp0-dp0/optim.exp_avg/final_norm.bias")
    assert st.shape == (64,) and st.pieces[0].global_box == Box((0,), (64,))
    word = sub(ptc, "pp0-tp0-dp1/optim.exp_avg/embedding.word_embeddings.weight")
    assert word.shape == (128 * 64,)
    assert [p.global_box for p in word.pieces] == [Box((0, 0), (100, 64))] and word.fill_boxes() == [
        Box((6400,), (8192,))
    ]


ALL_SPECS = [
    "gpt-tiny:tp2,pp2,dp1@1x4", "gpt-tiny:tp4,pp1@1x8", "bert-tiny:tp2,pp2@1x8", "llama-tiny:tp4,pp2,dp1@1x8",
    "moe-tiny:tp2,pp2,ep2@2x4", "gpt-tiny:tp1,pp3,first=2,layers=8@1x3", "gpt-large:tp8,pp4,dp1@4x8",
    *ZERO_SPECS,
]  # fmt: skip


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_every_ptc_is_complete_and_serializes(spec):
    ptc = ptc_from_spec(spec)
    ptc.check_complete()
    assert loads(dumps(ptc)) == ptc


def test_optimizer_state_mirrors_parameter_layout():
    ptc = ptc_from_spec("llama-tiny:tp2,pp1,dp1@1x2")
    param = sub(ptc, "pp0-tp1/layers.2.mlp.fc1.weight")
    for kind in ("fp32_param", "exp_avg", "exp_avg_sq"):
        state = sub(ptc, f"pp0-tp1/optim.{kind}/layers.2.mlp.fc1.weight")
        assert (state.shape, state.pieces) == (param.shape, param.pieces)


def test_gpt_175b_builds_in_seconds():
    start = time.perf_counter()
    ptc = ptc_from_spec("gpt-175b:tp8,pp16,dp8@128x8")
    elapsed = time.perf_counter() - start
    # 96 layers x 12 params + word, pos, final norm x 2, tied copy = 1157 params, x8 TP, x4 (param + Adam)
    assert len(ptc.subtensors) == 1157 * 8 * 4
    assert math.prod(ptc.tensor_map["layers.95.mlp.fc1.weight"].shape) == 4 * 12288 * 12288
    assert elapsed < 10, f"gpt-175b PTC took {elapsed:.1f}s"
