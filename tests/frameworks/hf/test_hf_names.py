"""The Megatron <-> Hugging Face Llama map (`hf.names`, `hf.config`) on its own, and a legacy
`mp_rank_*` Llama tree (TP2 x PP2, bf16) consolidated into a directory transformers loads."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.frameworks.hf.config import llama_config, megatron_dims
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.names import Dims, MapError, from_hf, map_names, megatron_name, to_hf

DIMS = Dims(layers=2, hidden=3, heads=4, groups=2, head_dim=2, ffn=5, vocab=7, padded_vocab=8)


def _megatron(dims: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"embedding.word_embeddings.weight": (dims.padded_vocab, dims.hidden), "final_norm.weight": (dims.hidden,),
              "output_layer.weight": (dims.padded_vocab, dims.hidden)}  # fmt: skip
    for i in range(dims.layers):
        shapes |= {f"layers.{i}.input_norm.weight": (dims.hidden,), f"layers.{i}.pre_mlp_norm.weight": (dims.hidden,),
                   f"layers.{i}.self_attention.linear_qkv.weight": ((dims.heads + 2 * dims.groups) * dims.head_dim, dims.hidden),
                   f"layers.{i}.self_attention.linear_proj.weight": (dims.hidden, dims.heads * dims.head_dim),
                   f"layers.{i}.mlp.fc1.weight": (2 * dims.ffn, dims.hidden), f"layers.{i}.mlp.fc2.weight": (dims.hidden, dims.ffn)}  # fmt: skip
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_qkv_rows_go_to_their_heads():
    """Megatron's rows, group by group [q heads of the group; k; v], labelled by what they are."""
    dims = Dims(layers=1, hidden=1, heads=4, groups=2, head_dim=1, ffn=1, vocab=1, padded_vocab=1)
    labels = ["q0", "q1", "k0", "v0", "q2", "q3", "k1", "v1"]
    m = {
        k: np.zeros(s, np.float32)
        for k, s in ((n, a.shape) for n, a in _megatron(dims, np.random.default_rng(0)).items())
    }
    m["layers.0.self_attention.linear_qkv.weight"] = np.array([[float(x[1:]) + (10 if x[0] == "k" else 20 if x[0] == "v" else 0)]
                                                               for x in labels], np.float32)  # fmt: skip
    hf = to_hf("llama", dims, m)
    assert hf["model.layers.0.self_attn.q_proj.weight"].ravel().tolist() == [0, 1, 2, 3]
    assert hf["model.layers.0.self_attn.k_proj.weight"].ravel().tolist() == [10, 11]
    assert hf["model.layers.0.self_attn.v_proj.weight"].ravel().tolist() == [20, 21]


def test_round_trip_splits_glu_and_vocab():
    m = _megatron(DIMS, np.random.default_rng(1))
    hf = to_hf("llama", DIMS, m)
    assert len(hf) == 3 + 9 * DIMS.layers == len(map_names("llama", DIMS))
    assert hf["model.embed_tokens.weight"].shape == (7, 3) and hf["lm_head.weight"].shape == (7, 3)
    np.testing.assert_array_equal(hf["model.layers.1.mlp.gate_proj.weight"], m["layers.1.mlp.fc1.weight"][:5])
    np.testing.assert_array_equal(hf["model.layers.1.mlp.up_proj.weight"], m["layers.1.mlp.fc1.weight"][5:])
    back = from_hf("llama", DIMS, hf)
    assert sorted(back) == sorted(m)
    for k, a in m.items():
        want = a.copy()
        if k in ("embedding.word_embeddings.weight", "output_layer.weight"):
            want[DIMS.vocab :] = 0  # padding comes back as zeros, as Megatron's loader fills it
        assert back[k].dtype == a.dtype and back[k].tobytes() == want.tobytes(), k


def test_map_errors_name_the_tensor():
    m = _megatron(DIMS, np.random.default_rng(2))
    with pytest.raises(
        MapError, match=r"src: tensor 'layers.0.mlp.fc1.weight' has shape \[9, 3\]; the glu map needs 10 rows"
    ):
        to_hf("llama", DIMS, m | {"layers.0.mlp.fc1.weight": np.zeros((9, 3), np.float32)}, "src")
    with pytest.raises(MapError, match=r"tensor 'final_norm.weight' is missing"):
        to_hf("llama", DIMS, {k: v for k, v in m.items() if k != "final_norm.weight"})
    with pytest.raises(MapError, match=r"tensor 'layers.9.mlp.fc1.weight' \(and 0 more\) has no place in the map"):
        to_hf("llama", DIMS, m | {"layers.9.mlp.fc1.weight": m["layers.0.mlp.fc1.weight"]})


def test_torch_dist_keys():
    assert megatron_name("decoder.layers.self_attention.linear_qkv.layer_norm_weight") == (
        "layers.{i}.input_norm.weight",
        True,
    )
    assert megatron_name("decoder.layers.3.mlp.linear_fc1.weight") == ("layers.3.mlp.fc1.weight", False)
    assert megatron_name("decoder.final_layernorm.weight") == ("final_norm.weight", False)
    assert megatron_name("optimizer.state.exp_avg.output_layer.weight") is None
    assert megatron_name("decoder.layers.self_attention.linear_qkv._extra_state") is None


ARGS = dict(num_layers=2, hidden_size=32, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
            ffn_hidden_size=64, padded_vocab_size=128, vocab_size=120, normalization="RMSNorm", swiglu=True,
            position_embedding_type="rope", untie_embeddings_and_output_weights=True, add_bias_linear=False,
            max_position_embeddings=64, rotary_base=500000, norm_epsilon=1e-6, bf16=True)  # fmt: skip


def test_config_from_args():
    args = argparse.Namespace(**ARGS)
    dims = megatron_dims(args, "common.pt")
    assert dims == Dims(2, 32, 4, 2, 8, 64, 120, 128)
    assert megatron_dims(args, "common.pt", vocab=100).vocab == 100
    config = llama_config(args, dims, "common.pt")
    assert (config["num_key_value_heads"], config["head_dim"], config["rope_theta"], config["rms_norm_eps"], config["dtype"]) == (
        2, 8, 500000.0, 1e-6, "bfloat16")  # fmt: skip
    from transformers import LlamaConfig

    loaded = LlamaConfig(**config)
    assert (loaded.vocab_size, loaded.intermediate_size, loaded.num_key_value_heads) == (120, 64, 2)


@pytest.mark.parametrize(("change", "match"), [
    ({"hidden_size": None}, r"common.pt: args.hidden_size is None, not a positive integer"),
    ({"vocab_size": 129}, r"common.pt: vocabulary 129 .* is not in 1..padded_vocab_size=128"),
    ({"num_query_groups": 3}, r"args.num_attention_heads=4 is not a multiple of num_query_groups=3"),
    ({"normalization": "LayerNorm"}, r"common.pt: args.normalization is 'LayerNorm'; a Hugging Face Llama needs 'RMSNorm'"),
    ({"untie_embeddings_and_output_weights": False}, r"args.untie_embeddings_and_output_weights is False"),
])  # fmt: skip
def test_config_refuses_what_is_not_a_llama(change, match):
    args = argparse.Namespace(**(ARGS | change))
    with pytest.raises(HfError, match=match):
        llama_config(args, megatron_dims(args, "common.pt"), "common.pt")


def test_cli_refuses_hf_arch_without_hf_output(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        cli, ["reshard", str(tmp_path), "--to", "whole", "--out", str(tmp_path / "o"), "--hf-vocab", "3"]
    )
    assert result.exit_code == 2 and "--hf-vocab applies with --hf-arch only" in result.output
    pytest.importorskip("transformers")
    from fixtures.hf import save_pretrained, tiny_llama

    src = save_pretrained(tiny_llama(), tmp_path / "src")
    result = runner.invoke(
        cli, ["reshard", str(src), "--to", "whole", "--out", str(tmp_path / "o"), "--hf-arch", "llama"]
    )
    assert result.exit_code == 2 and "--hf-arch maps Megatron checkpoints (--from megatron), not hf" in result.output
    result = runner.invoke(cli, ["reshard", str(src), "--to", "whole", "--out", str(tmp_path / "o"), "--hf-arch", "llama",
                                 "--format", "dcp"])  # fmt: skip
    assert (
        result.exit_code == 2
        and "it needs --format hf, or --from hf --format megatron-dist (got hf into dcp)" in result.output
    )
    assert not (tmp_path / "o").exists()


def test_a_legacy_tree_becomes_a_transformers_llama(tmp_path):
    """tenplex's independent builder of legacy Megatron trees (llama-tiny: GQA 4 heads / 2 groups,
    SwiGLU, RMSNorm, untied, bf16) at TP2 x PP2 -> HF: each weight is the builder's, re-fused here."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from fixtures.megatron.tree import build_tree
    from tenplex.frontends.spec import parse_spec

    spec = parse_spec("llama-tiny:tp2,pp2@1x4")
    built = build_tree(tmp_path / "src", spec.model, spec.parallel)
    out = tmp_path / "hf"
    result = CliRunner().invoke(cli, ["reshard", str(tmp_path / "src"), "--from", "megatron", "--format", "hf", "--hf-arch", "llama",
                                      "--to", "whole", "--out", str(out), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["src_format"] == "megatron"
    sd = load_file(out / "model.safetensors")
    m, hn = spec.model, spec.model.head_dim
    for i in range(m.num_layers):
        p = f"model.layers.{i}."
        q = sd[p + "self_attn.q_proj.weight"].reshape(m.query_groups, m.heads // m.query_groups, hn, -1)
        k, v = (sd[p + f"self_attn.{x}_proj.weight"].reshape(m.query_groups, 1, hn, -1) for x in "kv")
        got = {"self_attention.linear_qkv.weight": torch.cat([q, k, v], 1).reshape(-1, m.hidden),
               "mlp.fc1.weight": torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]),
               "mlp.fc2.weight": sd[p + "mlp.down_proj.weight"], "self_attention.linear_proj.weight": sd[p + "self_attn.o_proj.weight"],
               "input_norm.weight": sd[p + "input_layernorm.weight"], "pre_mlp_norm.weight": sd[p + "post_attention_layernorm.weight"]}  # fmt: skip
        for name, t in got.items():
            want = built.truth[f"layers.{i}.{name}"]
            assert (
                t.dtype == torch.bfloat16 and t.float().numpy().tobytes() == np.asarray(want, np.float32).tobytes()
            ), (i, name)
    for hf, name in (("model.embed_tokens.weight", "embedding.word_embeddings.weight"), ("lm_head.weight", "output_layer.weight"),
                     ("model.norm.weight", "final_norm.weight")):  # fmt: skip
        assert sd[hf].float().numpy().tobytes() == np.asarray(built.truth[name], np.float32).tobytes(), hf
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 1000 and {k for k, _ in model.named_parameters()} == set(sd)


def test_megatron_args_of_a_transformers_config_read_back():
    from tenplex.frameworks.hf.config import megatron_args

    config = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 120, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "dtype": "bfloat16"}  # fmt: skip
    args = megatron_args(config, 2, 2, 1, "config.json")
    dims = megatron_dims(args, "common.pt")
    assert dims == Dims(2, 32, 4, 2, 8, 64, 120, 256)  # padded to a multiple of 128 * tp
    back = llama_config(args, dims, "common.pt")
    assert {k: back[k] for k in config} == config
    with pytest.raises(HfError, match=r"config.json: tie_word_embeddings is True; tenplex maps untied Llamas"):
        megatron_args(config | {"tie_word_embeddings": True}, 1, 1, 1, "config.json")
    with pytest.raises(HfError, match=r"config.json: model_type is 'gpt2'"):
        megatron_args(config | {"model_type": "gpt2"}, 1, 1, 1, "config.json")
    with pytest.raises(HfError, match=r"config.json: hidden_size is missing"):
        megatron_args({k: v for k, v in config.items() if k != "hidden_size"}, 1, 1, 1, "config.json")
