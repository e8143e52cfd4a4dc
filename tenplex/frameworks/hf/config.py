"""A transformers `config.json` from Megatron-LM's saved `args`, and the `Dims` of the name map.

`megatron_dims(args, where, vocab=None)` reads the sizes from the args Namespace Megatron-LM saves
(`common.pt` of `torch_dist`, `model_optim_rng.pt` of the legacy tree): `num_layers`,
`hidden_size`, `num_attention_heads`, `num_query_groups` (with `group_query_attention`; else the
heads), `kv_channels` (default hidden / heads), `ffn_hidden_size`, `padded_vocab_size`; the
tokenizer's V is `vocab` when given, else `vocab_size` when Megatron saved one, else the padded
size (then every padded row is carried, as Megatron's own converter does without
`--true-vocab-size`).

`llama_config(args, dims, dtype, where)` checks that the args describe a Llama (`normalization`
RMSNorm, `swiglu`, `position_embedding_type` rope with `rotary_percent` 1 and no
`rotary_interleaved` or `use_rope_scaling`, untied embeddings, no linear or QKV biases) and
returns `LlamaForCausalLM`'s config: `rms_norm_eps` from `norm_epsilon`, the RoPE base from
`rotary_base`, `max_position_embeddings` from `max_position_embeddings` (else `seq_length`),
`dtype` (transformers 5; `torch_dtype` for older readers) from the parameters' dtype.

`megatron_args(config, tp, pp, dp, where)` is the reverse: the args a Megatron-LM job of that
Llama would save (`tenplex reshard HF --format megatron-dist --hf-arch llama`).

Raises `HfError` naming the file and the field: a missing or wrong-typed size, a setting the
architecture does not have.
"""

from __future__ import annotations

import argparse
from typing import Any

from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.names import Dims

__all__ = ["llama_config", "megatron_args", "megatron_dims"]


def _int(args: Any, field: str, where: str, default: int | None = None) -> int:
    value = getattr(args, field, None)
    value = default if value is None else value
    if type(value) is not int or value < 1:
        raise HfError(f"{where}: args.{field} is {value!r}, not a positive integer (Megatron-LM saves it in args)")
    return value


def megatron_dims(args: Any, where: str, vocab: int | None = None) -> Dims:
    """The map's sizes from Megatron-LM's args (see the module docstring)."""
    if args is None:
        raise HfError(f"{where}: no args saved (megatron-core's dist_checkpointing.save called without Megatron-LM's "
                      "args): the model's dimensions for a Hugging Face config are unknown")  # fmt: skip
    hidden, heads = _int(args, "hidden_size", where), _int(args, "num_attention_heads", where)
    gqa = bool(getattr(args, "group_query_attention", False))
    groups = _int(args, "num_query_groups", where) if gqa else heads
    padded = _int(args, "padded_vocab_size", where)
    true = vocab if vocab is not None else getattr(args, "vocab_size", None) or padded
    if type(true) is not int or not 1 <= true <= padded:
        raise HfError(
            f"{where}: vocabulary {true!r} (args.vocab_size or --hf-vocab) is not in 1..padded_vocab_size={padded}"
        )
    if heads % groups:
        raise HfError(f"{where}: args.num_attention_heads={heads} is not a multiple of num_query_groups={groups}")
    return Dims(_int(args, "num_layers", where), hidden, heads, groups, _int(args, "kv_channels", where, hidden // heads),
                _int(args, "ffn_hidden_size", where), true, padded)  # fmt: skip


_LLAMA_ARGS = (  # (field, what a Llama needs, Megatron-LM's default)
    ("normalization", "RMSNorm", "LayerNorm"), ("swiglu", True, False), ("position_embedding_type", "rope", "learned_absolute"),
    ("rotary_percent", 1.0, 1.0), ("rotary_interleaved", False, False), ("use_rope_scaling", False, False),
    ("untie_embeddings_and_output_weights", True, False), ("add_bias_linear", False, True), ("add_qkv_bias", False, False),
)  # fmt: skip


def _dtype(args: Any) -> str:
    return "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else "float32"


def llama_config(args: Any, dims: Dims, where: str) -> dict[str, Any]:
    """`LlamaForCausalLM`'s config.json of Megatron-LM's args (see the module docstring)."""
    for field, want, default in _LLAMA_ARGS:
        got = getattr(args, field, default)
        if got != want:
            raise HfError(f"{where}: args.{field} is {got!r}; a Hugging Face Llama needs {want!r} "
                          "(--hf-arch llama maps Megatron's RMSNorm + SwiGLU + RoPE GPT with untied embeddings and no biases)")  # fmt: skip
    theta = float(getattr(args, "rotary_base", 10000))
    dtype = _dtype(args)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dims.hidden,
        "intermediate_size": dims.ffn, "num_hidden_layers": dims.layers, "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.groups, "head_dim": dims.head_dim, "vocab_size": dims.vocab,
        "max_position_embeddings": getattr(args, "max_position_embeddings", None) or _int(args, "seq_length", where),
        "rms_norm_eps": float(getattr(args, "norm_epsilon", 1e-5)), "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False, "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "dtype": dtype, "torch_dtype": dtype,
    }  # fmt: skip


def _get(config: dict[str, Any], field: str, where: str, default: Any = None) -> Any:
    value = config.get(field, default)
    if value is None:
        raise HfError(f"{where}: {field} is missing (a transformers Llama config holds it)")
    return value


def megatron_args(config: dict[str, Any], tp: int, pp: int, dp: int, where: str) -> argparse.Namespace:
    """The args Megatron-LM would have saved for a job training the Llama of `config` (config.json)
    under tp x pp x dp: what `megatron_dims` and `llama_config` read back (the vocabulary padded
    as Megatron pads it: to a multiple of 128·tp)."""
    if config.get("model_type") != "llama":
        raise HfError(f"{where}: model_type is {config.get('model_type')!r}; --hf-arch llama reads a Llama config")
    for field, bad in (("tie_word_embeddings", True), ("attention_bias", True), ("mlp_bias", True)):
        if config.get(field, False) is bad:
            raise HfError(f"{where}: {field} is {bad}; tenplex maps untied Llamas without biases")
    if (config.get("rope_scaling") or {}).get("rope_type", "default") != "default" or config.get(
        "hidden_act", "silu"
    ) != "silu":
        raise HfError(f"{where}: rope_scaling or hidden_act other than Llama's default: no Megatron args say it here")
    hidden, heads, vocab = (_get(config, k, where) for k in ("hidden_size", "num_attention_heads", "vocab_size"))
    step = 128 * tp
    rope = config.get("rope_parameters") or {}
    return argparse.Namespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=dp, world_size=tp * pp * dp,
        num_layers=_get(config, "num_hidden_layers", where), hidden_size=hidden, num_attention_heads=heads,
        group_query_attention=True, num_query_groups=config.get("num_key_value_heads") or heads,
        kv_channels=config.get("head_dim") or hidden // heads, ffn_hidden_size=_get(config, "intermediate_size", where),
        normalization="RMSNorm", swiglu=True, position_embedding_type="rope", rotary_percent=1.0,
        rotary_base=int(rope.get("rope_theta", config.get("rope_theta", 10000))), norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=_get(config, "max_position_embeddings", where), seq_length=config["max_position_embeddings"],
        untie_embeddings_and_output_weights=True, add_bias_linear=False, add_qkv_bias=False,
        make_vocab_size_divisible_by=128, vocab_size=vocab, padded_vocab_size=-(-vocab // step) * step,
        bf16=config.get("dtype", config.get("torch_dtype")) == "bfloat16", fp16=config.get("dtype", config.get("torch_dtype")) == "float16",
        seed=1234,
    )  # fmt: skip
