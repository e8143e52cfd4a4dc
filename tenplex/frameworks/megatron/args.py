"""Megatron `args` (the run's argparse Namespace, saved in every rank file) <-> the frontend's
`ModelSpec` and `ParallelConfig`, and the short layout syntax `tp=4,pp=1[,dp=2][,vpp=2]`.

Model fields come from num_layers, hidden_size, num_attention_heads, group_query_attention /
num_query_groups, kv_channels, ffn_hidden_size, swiglu, normalization, add_bias_linear,
untie_embeddings_and_output_weights, position_embedding_type / max_position_embeddings,
fp16 / bf16, make_vocab_size_divisible_by and the vocabulary (below). Layout fields come from
tensor/pipeline_model_parallel_size, data_parallel_size (or world_size), the virtual pipeline size
(or num_layers_per_virtual_pipeline_stage), use_distributed_optimizer and the uneven first/last
stage counts (both spellings).

Vocabulary: the true size V is `vocab` when given, else args.vocab_size, else args.padded_vocab_size
(then every padded row counts as real and is carried, as Megatron's own converter does without
--true-vocab-size).

Invariants (CheckpointFormatError naming the file and the `args` field):
- V pads to args.padded_vocab_size with the checkpoint's TP (Vp = ceil(V/(m·t))·m·t);
- features the frontend cannot express are refused, never ignored: MoE, expert or context
  parallelism, add_qkv_bias without add_bias_linear, explicit pipeline layouts, standalone
  embedding stages, optimizers other than Adam.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.frontends.layout import padded_vocab
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tenplex.ir.errors import SpecError

_FIRST = ("num_layers_in_first_pipeline_stage", "decoder_first_pipeline_num_layers")
_LAST = ("num_layers_in_last_pipeline_stage", "decoder_last_pipeline_num_layers")
_REFUSED = {  # field -> (what it enables, predicate on its value)
    "num_experts": ("mixture-of-experts models", bool),
    "expert_model_parallel_size": ("expert parallelism", lambda v: v > 1),
    "context_parallel_size": ("context parallelism", lambda v: v > 1),
    "standalone_embedding_stage": ("a standalone embedding stage", bool),
    "account_for_embedding_in_pipeline_split": ("an embedding-aware pipeline split", bool),
    "account_for_loss_in_pipeline_split": ("a loss-aware pipeline split", bool),
    "pipeline_model_parallel_layout": ("an explicit pipeline layout", bool),
}
_LAYOUT_KEYS = ("tp", "pp", "dp", "vpp", "zero", "first", "last")
_TOKEN = re.compile(r"([a-z]+)=?(\d+)")
_MISSING = object()


def _get(args: argparse.Namespace, name: str, file: Path, default: Any = _MISSING) -> Any:
    value = getattr(args, name, default)
    if value is _MISSING:
        raise CheckpointFormatError(f"{file}: key 'args' has no field {name!r}")
    return value


def _first_set(args: argparse.Namespace, names: tuple[str, ...]) -> int | None:
    for name in names:
        if getattr(args, name, None) is not None:
            return int(getattr(args, name))
    return None


def _refuse(args: argparse.Namespace, file: Path) -> None:
    for name, (what, refused) in _REFUSED.items():
        value = getattr(args, name, None)
        if value is not None and refused(value):
            raise CheckpointFormatError(f"{file}: args.{name}={value!r} asks for {what}, which is not supported")
    if not getattr(args, "add_bias_linear", True) and getattr(args, "add_qkv_bias", False):
        raise CheckpointFormatError(f"{file}: args.add_qkv_bias=True with add_bias_linear=False is not supported")


def _vocab(args: argparse.Namespace, file: Path, vocab: int | None, tp: int, multiple: int) -> int:
    padded = int(_get(args, "padded_vocab_size", file))
    true = vocab if vocab is not None else getattr(args, "vocab_size", None)
    if not isinstance(true, int) or isinstance(true, bool):
        return padded
    if padded_vocab(true, tp, multiple) != padded:
        raise CheckpointFormatError(
            f"{file}: args.padded_vocab_size={padded}, but vocab {true} pads to {padded_vocab(true, tp, multiple)} "
            f"with tp={tp}, make_vocab_size_divisible_by={multiple} (pass the true vocab size)"
        )
    return true


def _dtype(args: argparse.Namespace) -> str:
    if getattr(args, "fp16", False):
        return "float16"
    return "bfloat16" if getattr(args, "bf16", False) else "float32"


def model_from_args(args: Any, file: Path, *, vocab: int | None = None, optimizer: bool = True) -> ModelSpec:
    """The ModelSpec of a checkpoint's `args`; `optimizer` says whether optimizer state was saved.

    Raises:
        CheckpointFormatError: a field is missing or names an unsupported feature.
    """
    if not isinstance(args, argparse.Namespace):
        raise CheckpointFormatError(f"{file}: key 'args' holds {type(args).__name__}, expected argparse.Namespace")
    _refuse(args, file)
    heads, hidden = int(_get(args, "num_attention_heads", file)), int(_get(args, "hidden_size", file))
    groups = int(args.num_query_groups) if getattr(args, "group_query_attention", False) else heads
    position = getattr(args, "position_embedding_type", "learned_absolute")
    learned = position == "learned_absolute" and getattr(args, "add_position_embedding", True)
    norm = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}.get(getattr(args, "normalization", "LayerNorm"))
    if norm is None:
        raise CheckpointFormatError(f"{file}: args.normalization={args.normalization!r} is not LayerNorm or RMSNorm")
    if optimizer and getattr(args, "optimizer", "adam") != "adam":
        raise CheckpointFormatError(f"{file}: args.optimizer={args.optimizer!r}: only Adam state is supported")
    multiple = int(getattr(args, "make_vocab_size_divisible_by", 128))
    tp = int(_get(args, "tensor_model_parallel_size", file))
    try:
        return ModelSpec(
            kind="gpt" if learned else "llama", num_layers=int(_get(args, "num_layers", file)), hidden=hidden,
            heads=heads, ffn_hidden=int(getattr(args, "ffn_hidden_size", None) or 4 * hidden),
            vocab=_vocab(args, file, vocab, tp, multiple), query_groups=groups,
            head_dim=int(getattr(args, "kv_channels", None) or hidden // heads),
            max_position=int(_get(args, "max_position_embeddings", file)) if learned else 0,
            glu=bool(getattr(args, "swiglu", False)), norm=norm, bias_linear=bool(getattr(args, "add_bias_linear", True)),
            tied_embeddings=not getattr(args, "untie_embeddings_and_output_weights", False), dtype=_dtype(args),
            optimizer="adam" if optimizer else "none", make_vocab_size_divisible_by=multiple,
        )  # fmt: skip
    except SpecError as e:
        raise CheckpointFormatError(f"{file}: key 'args' describes no valid model: {e}") from None


def parallel_from_args(args: argparse.Namespace, file: Path) -> ParallelConfig:
    """The ParallelConfig of a checkpoint's `args`. Raises CheckpointFormatError."""
    tp, pp = int(_get(args, "tensor_model_parallel_size", file)), int(_get(args, "pipeline_model_parallel_size", file))
    dp = getattr(args, "data_parallel_size", None) or int(_get(args, "world_size", file)) // (tp * pp)
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None)
    per_chunk = getattr(args, "num_layers_per_virtual_pipeline_stage", None)
    if vpp is None and per_chunk:
        vpp = int(args.num_layers) // pp // int(per_chunk)
    try:
        return ParallelConfig(
            tp=tp, pp=pp, dp=int(dp), vpp=int(vpp or 1), zero=int(bool(getattr(args, "use_distributed_optimizer", False))),
            first=_first_set(args, _FIRST), last=_first_set(args, _LAST),
        )  # fmt: skip
    except SpecError as e:
        raise CheckpointFormatError(f"{file}: key 'args' describes no valid layout: {e}") from None


def args_for(args: argparse.Namespace, model: ModelSpec, parallel: ParallelConfig, pp: int, tp: int) -> argparse.Namespace:
    """A copy of `args` rewritten for rank (pp, tp) of `parallel`: sizes, world, virtual pipeline,
    uneven split, padded vocabulary, distributed optimizer and the saving rank. Fields keep their
    order; optional fields are set only where the source has them."""
    out = argparse.Namespace(**vars(args))
    dp = parallel.world // (parallel.tp * parallel.pp)
    vpp = parallel.vpp if parallel.vpp > 1 else None
    required = {
        "tensor_model_parallel_size": parallel.tp, "pipeline_model_parallel_size": parallel.pp,
        "data_parallel_size": dp, "world_size": parallel.world,
        "padded_vocab_size": padded_vocab(model.vocab, parallel.tp, model.make_vocab_size_divisible_by),
        "virtual_pipeline_model_parallel_size": vpp,
    }  # fmt: skip
    optional = {
        "num_layers_per_virtual_pipeline_stage": model.num_layers // (parallel.pp * parallel.vpp) if vpp else None,
        "transformer_pipeline_model_parallel_size": parallel.pp,
        "rank": parallel.rank(pp, 0, tp), "local_rank": parallel.rank(pp, 0, tp),
        **dict.fromkeys(_FIRST, parallel.first), **dict.fromkeys(_LAST, parallel.last),
    }  # fmt: skip
    if model.has_optimizer:  # without optimizer state the layout does not show the optimizer kind
        required["use_distributed_optimizer"] = bool(parallel.zero)
    for name, value in required.items():
        setattr(out, name, value)
    for name, value in optional.items():
        if hasattr(out, name):
            setattr(out, name, value)
    return out


def parse_layout(text: str) -> dict[str, int]:
    """`tp=4,pp=1[,dp=2][,vpp=2][,zero=1][,first=N][,last=N]` (or `tp4,pp1`) -> {key: int}.

    Raises:
        SpecError: naming the layout and the token that is not one of those keys with an integer.
    """
    out: dict[str, int] = {}
    for token in filter(None, (t.strip() for t in text.split(","))):
        m = _TOKEN.fullmatch(token)
        if m is None or m[1] not in _LAYOUT_KEYS:
            raise SpecError(f"layout {text!r}: token {token!r} is not one of {', '.join(k + '=N' for k in _LAYOUT_KEYS)}")
        if m[1] in out:
            raise SpecError(f"layout {text!r}: {m[1]} is given twice")
        out[m[1]] = int(m[2])
    if not out:
        raise SpecError(f"layout {text!r}: empty (expected e.g. tp=4,pp=1)")
    return out
