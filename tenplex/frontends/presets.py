"""Named model presets (published sizes plus tiny models for tests and demos).

Presets are kept as field dicts, not `ModelSpec`s, so that an override such as `hidden=256`
re-derives the defaults that depend on it (head_dim = hidden / heads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tenplex.frontends.model import ModelSpec
from tenplex.ir.errors import SpecError

_GPT: dict[str, Any] = {"kind": "gpt", "vocab": 50257, "max_position": 2048}
_LLAMA: dict[str, Any] = {
    "kind": "llama", "vocab": 32000, "norm": "rmsnorm", "glu": True, "bias_linear": False,
    "tied_embeddings": False, "max_position": 0,
}  # fmt: skip
_GPT_1_3B = {**_GPT, "num_layers": 24, "hidden": 2048, "heads": 16, "ffn_hidden": 8192}

_LLAMA_TINY = {
    **_LLAMA,
    "num_layers": 4,
    "hidden": 64,
    "heads": 4,
    "query_groups": 2,
    "ffn_hidden": 128,
    "vocab": 1000,
}

PRESETS: dict[str, dict[str, Any]] = {
    "gpt-1.3b": _GPT_1_3B,
    "gpt-3-xl": _GPT_1_3B,
    "gpt-2.7b": {**_GPT, "num_layers": 32, "hidden": 2560, "heads": 32, "ffn_hidden": 10240},
    "gpt-6.7b": {**_GPT, "num_layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 16384},
    "gpt-175b": {**_GPT, "num_layers": 96, "hidden": 12288, "heads": 96, "ffn_hidden": 49152},
    # The Tenplex reference's test model (Megatron GPT, fp16).
    "gpt-large": {
        **_GPT,
        "num_layers": 24,
        "hidden": 1536,
        "heads": 16,
        "ffn_hidden": 6144,
        "max_position": 1024,
        "dtype": "float16",
    },
    "bert-large": {
        "kind": "bert",
        "num_layers": 24,
        "hidden": 1024,
        "heads": 16,
        "ffn_hidden": 4096,
        "vocab": 30522,
        "max_position": 512,
    },
    "llama-7b": {**_LLAMA, "num_layers": 32, "hidden": 4096, "heads": 32, "query_groups": 32, "ffn_hidden": 11008},
    "llama-70b": {**_LLAMA, "num_layers": 80, "hidden": 8192, "heads": 64, "query_groups": 8, "ffn_hidden": 28672},
    "gpt-tiny": {
        "kind": "gpt",
        "num_layers": 4,
        "hidden": 64,
        "heads": 4,
        "ffn_hidden": 256,
        "vocab": 1000,
        "max_position": 128,
    },
    "bert-tiny": {
        "kind": "bert",
        "num_layers": 2,
        "hidden": 64,
        "heads": 4,
        "ffn_hidden": 256,
        "vocab": 1000,
        "max_position": 64,
    },
    "llama-tiny": _LLAMA_TINY,
    "moe-tiny": {**_LLAMA_TINY, "num_experts": 4},
}

MODEL_FIELDS = tuple(a.name for a in attrs.fields(ModelSpec))


def model_from_fields(fields: Mapping[str, Any], where: str = "model") -> ModelSpec:
    """A ModelSpec from a field dict; unknown fields raise SpecError naming `where`."""
    unknown = sorted(set(fields) - set(MODEL_FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown model field {unknown[0]!r} (known: {', '.join(MODEL_FIELDS)})")
    missing = [f for f in ("kind", "num_layers", "hidden", "heads", "ffn_hidden", "vocab") if f not in fields]
    if missing:
        raise SpecError(f"{where}: missing model field {missing[0]!r}")
    try:
        return ModelSpec(**fields)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def preset(name: str, **overrides: Any) -> ModelSpec:
    """The preset `name` with fields replaced by `overrides`. Raises SpecError."""
    if name not in PRESETS:
        raise SpecError(f"unknown model preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return model_from_fields({**PRESETS[name], **overrides}, where=f"model {name!r}")
