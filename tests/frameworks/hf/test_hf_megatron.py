"""A Megatron TP2 x PP2 Llama job, saved by megatron-core itself (`torch_dist`, bf16, padded
vocabulary, Adam state), consolidated by `tenplex reshard --format hf --hf-arch llama` into a
directory that transformers' `from_pretrained` loads: every weight equal bit for bit to what the
Megatron ranks saved (the map undone here, independently of tenplex), and the HF model's logits
equal to megatron-core's own forward pass of the checkpoint."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core (a peer package) is not installed", allow_module_level=True)
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from click.testing import CliRunner  # noqa: E402

from fixtures.megatron_dist.dumps import whole  # noqa: E402
from fixtures.megatron_dist.gpt import ITERATION, Job, load, logits, save  # noqa: E402
from tenplex.cli.app import cli  # noqa: E402
from tenplex.frameworks.formats import detect, inspect  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]  # fmt: skip

JOB = Job(tp=2, pp=2, llama=True, dtype="bfloat16", true_vocab=120)  # heads 4, groups 2, head_dim 8, ffn 64, Vp 128
TOKENS = [1, 5, 7, 100, 119, 3]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor], Path]:
    """(Megatron tree, the whole tensors its ranks saved, its HF consolidation by the CLI)."""
    root = tmp_path_factory.mktemp("mhf")
    saved = save(root / "src", JOB)
    out = root / "hf"
    result = CliRunner().invoke(cli, ["reshard", str(root / "src"), "--from", "megatron", "--format", "hf", "--hf-arch", "llama",
                                      "--to", "whole", "--out", str(out), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["src_format"], doc["out_format"], doc["verified"]) == ("megatron-dist", "hf", True)
    assert "vocabulary 120 of 128" in doc["summary"]
    return root / "src", whole(saved), out


def _megatron_of_hf(sd: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Megatron's torch_dist tensors rebuilt from a transformers Llama state dict: QKV re-fused per
    query group [q heads; k; v], fc1 = [gate; up], layers stacked (vocabulary left at V rows)."""
    heads, groups, hn = JOB.heads, JOB.groups, JOB.hidden // JOB.heads
    per_layer: dict[str, list] = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        q = sd[p + "self_attn.q_proj.weight"].reshape(groups, heads // groups, hn, -1)
        k, v = (sd[p + f"self_attn.{x}_proj.weight"].reshape(groups, 1, hn, -1) for x in "kv")
        rows = {"self_attention.linear_qkv.weight": torch.cat([q, k, v], 1).reshape(-1, JOB.hidden),
                "self_attention.linear_proj.weight": sd[p + "self_attn.o_proj.weight"],
                "self_attention.linear_qkv.layer_norm_weight": sd[p + "input_layernorm.weight"],
                "mlp.linear_fc1.layer_norm_weight": sd[p + "post_attention_layernorm.weight"],
                "mlp.linear_fc1.weight": torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]),
                "mlp.linear_fc2.weight": sd[p + "mlp.down_proj.weight"]}  # fmt: skip
        for k_, t in rows.items():
            per_layer.setdefault(k_, []).append(t)
    out = {f"decoder.layers.{k}": torch.stack(ts) for k, ts in per_layer.items()}
    out.update({"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"], "output_layer.weight": sd["lm_head.weight"],
                "decoder.final_layernorm.weight": sd["model.norm.weight"]})  # fmt: skip
    return out


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_transformers_loads_every_weight_bit_for_bit(job):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    _, saved, out = job
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = AutoConfig.from_pretrained(out)
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads, config.vocab_size) == (
        "llama",
        4,
        2,
        120,
    )
    files = load_file(out / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert {k for k, _ in model.named_parameters()} == set(
        files
    )  # every parameter came from the file: none initialised
    got = _megatron_of_hf(files, JOB.layers)
    model_keys = {k for k in saved if not k.startswith("optimizer.")}
    assert sorted(got) == sorted(model_keys)  # the Adam state stayed behind
    for key, t in got.items():
        want = (
            saved[key][: JOB.true_vocab]
            if key in ("embedding.word_embeddings.weight", "output_layer.weight")
            else saved[key]
        )
        assert t.dtype == want.dtype and t.shape == want.shape and _bits(t) == _bits(want), key
    assert files["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16  # bf16 stays bf16
    for name, p in model.named_parameters():  # from_pretrained holds the file's values (norms cast to the model's bf16)
        assert torch.equal(p.detach(), files[name].to(p.dtype)), name


def test_the_logits_are_megatrons_own(job):
    """megatron-core's forward pass (tp=1, pp=1, float32, loading the bf16 checkpoint) and the HF
    model's (float32) give the same logits over the true vocabulary: the map of QKV, SwiGLU, RoPE and norms is right."""
    from transformers import AutoModelForCausalLM

    src, _, out = job
    theirs = logits(src / f"iter_{ITERATION:07d}", Job(llama=True, optimizer="none"), TOKENS)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = model(torch.tensor([TOKENS])).logits
    assert ours.shape == (1, len(TOKENS), JOB.true_vocab) and theirs.shape == (1, len(TOKENS), JOB.vocab)
    torch.testing.assert_close(ours, theirs[..., : JOB.true_vocab], rtol=1e-5, atol=1e-5)


def test_sharded_output_and_inspect(job, tmp_path):
    from transformers import AutoModelForCausalLM

    src, _, whole = job
    out = tmp_path / "sharded"
    result = CliRunner().invoke(cli, ["reshard", str(src), "--format", "hf", "--hf-arch", "llama", "--to", "max_shard_size=40KB",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        f"tenplex: consolidated megatron-dist {src} into a Hugging Face llama model {out} (39 tensors"
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3 and detect(out) == "hf"
    a = AutoModelForCausalLM.from_pretrained(out).state_dict()
    b = AutoModelForCausalLM.from_pretrained(whole).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert inspect(str(src))[-1].startswith("Hugging Face: a Llama (LlamaForCausalLM)")
    lines = inspect(str(whole))
    assert (
        "Hugging Face llama (LlamaForCausalLM) from config.json: num_hidden_layers=4, hidden_size=32, num_attention_heads=4, "
        "num_key_value_heads=2, intermediate_size=64, vocab_size=120, dtype=bfloat16" in lines
    )
    assert any(x.startswith("tensors: exactly those of tenplex's Megatron <-> llama map") for x in lines)


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> tuple[dict[str, torch.Tensor], Path, object]:
    """(a transformers Llama's tensors, the TP2 x PP2 torch_dist tree tenplex started from it, the model)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("hfm")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(root / "hf")
    result = CliRunner().invoke(cli, ["reshard", str(root / "hf"), "--format", "megatron-dist", "--hf-arch", "llama",
                                      "--to", "tp=2,pp=2", "--out", str(root / "m"), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["src_format"], doc["out_format"], doc["verified"]) == ("hf", "megatron-dist", True)
    return load_file(root / "hf" / "model.safetensors"), root / "m", model


STARTED = Job(tp=2, pp=2, layers=2, llama=True, dtype="bfloat16", optimizer="none", vocab=256)  # 128 padded for tp=2


def test_megatron_loads_a_job_started_from_hf(started):
    """megatron-core's own `dist_checkpointing.load` under TP2 x PP2 restores every HF weight, bit for bit."""
    sd, out, _ = started
    assert detect(out) == "megatron-dist" and (out / "latest_checkpointed_iteration.txt").read_text() == "release"
    lines = inspect(str(out))
    assert "saved under tp=2,pp=2,dp=1 (from common.pt args)" in lines
    assert lines[-1].startswith("Hugging Face: a Llama (LlamaForCausalLM); tenplex reshard --format hf --hf-arch llama")
    got = whole(load(out / "release", STARTED))
    want = _megatron_of_hf(sd, 2)
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        t = got[key]
        if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
            assert t.shape == (256, 32) and not t[128:].any(), key  # Megatron's padding rows: zeros
            t = t[:128]
        if t.dtype != w.dtype:  # megatron-core keeps its norms in float32: an exact upcast of the bf16 weight
            assert t.dtype == torch.float32 and "norm" in key, key
            w = w.float()
        assert t.shape == w.shape and _bits(t) == _bits(w), key


def test_the_started_job_computes_the_hf_models_logits(started):
    _, out, model = started
    theirs = logits(out / "release", Job(layers=2, llama=True, optimizer="none", vocab=256), TOKENS)
    with torch.no_grad():
        ours = model.float()(torch.tensor([TOKENS])).logits
    torch.testing.assert_close(theirs[..., :128], ours, rtol=1e-5, atol=1e-5)
    assert not theirs[..., 128:].any()  # the zero padding rows of the output layer
