"""Parameter keys of Megatron-LM checkpoints: legacy and megatron-core (mcore) naming.

The frontend names every parameter by its legacy key under the chunk (`Param.key`, e.g.
`language_model/encoder/layers.3.mlp.dense_h_to_4h.weight`; '/' separates nested dicts). A
`Naming` spells that key the way a checkpoint does, and orders a chunk's parameters the way the
framework's `named_parameters()` does (the order of optimizer param groups and flat buffers).

| frontend (legacy) key                      | legacy, before Sept 2023  | mcore local spec / TE spec                          |
|--------------------------------------------|---------------------------|-----------------------------------------------------|
| language_model/embedding/word_embeddings/weight | same                 | embedding.word_embeddings.weight                    |
| language_model/embedding/position_embeddings/weight | same             | embedding.position_embeddings.weight                |
| .../layers.j.input_norm.{w,b}              | layers.j.input_layernorm  | decoder.layers.j.input_layernorm / self_attention.linear_qkv.layer_norm_{weight,bias} |
| .../layers.j.self_attention.query_key_value | same                     | decoder.layers.j.self_attention.linear_qkv          |
| .../layers.j.self_attention.dense          | same                      | decoder.layers.j.self_attention.linear_proj         |
| .../layers.j.post_attention_norm.{w,b}     | post_attention_layernorm  | decoder.layers.j.pre_mlp_layernorm / mlp.linear_fc1.layer_norm_{weight,bias} |
| .../layers.j.mlp.dense_h_to_4h / dense_4h_to_h | same                  | decoder.layers.j.mlp.linear_fc1 / linear_fc2        |
| language_model/encoder/final_norm.{w,b}    | final_layernorm           | decoder.final_layernorm                             |
| language_model/output_layer/weight         | same                      | output_layer.weight                                 |
| word_embeddings_for_head/weight (tied, PP>1) | same                    | output_layer.weight                                 |

Order: the legacy attention registers query_key_value before dense; mcore's `Attention` registers
linear_proj before the `SelfAttention` subclass adds linear_qkv; inside a TE linear the fused norm
parameters come before weight and bias. mcore linear modules also save `<module>._extra_state`
(None for the local spec, FP8 metadata for TE): no parameter, kept by module name.

Keys inside a file are written as `/`-joined paths of the nested dicts (`flatten`, `nest`), e.g.
`model/language_model/encoder/layers.0.input_norm.weight` (the dots belong to the flat key).

Invariants: `key` is injective on a chunk's parameters; `order` is a permutation of its input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from tenplex.frontends.params import Param

FAMILIES = ("legacy", "mcore")
EXTRA = "._extra_state"
_LAYER = re.compile(r"language_model/encoder/layers\.(\d+)\.(.+)\.(weight|bias)")
_MCORE_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_MODULES = {
    "input_norm": "input_layernorm",
    "self_attention.query_key_value": "self_attention.linear_qkv",
    "self_attention.dense": "self_attention.linear_proj",
    "post_attention_norm": "pre_mlp_layernorm",
    "mlp.dense_h_to_4h": "mlp.linear_fc1",
    "mlp.dense_4h_to_h": "mlp.linear_fc2",
}
_TE_NORMS = {"input_norm": "self_attention.linear_qkv", "post_attention_norm": "mlp.linear_fc1"}
_TOP = {
    "language_model/embedding/word_embeddings/weight": "embedding.word_embeddings.weight",
    "language_model/embedding/position_embeddings/weight": "embedding.position_embeddings.weight",
    "language_model/encoder/final_norm.weight": "decoder.final_layernorm.weight",
    "language_model/encoder/final_norm.bias": "decoder.final_layernorm.bias",
    "language_model/output_layer/weight": "output_layer.weight",
    "word_embeddings_for_head/weight": "output_layer.weight",
}
_OLD_NORMS = (("input_norm.", "input_layernorm."), ("post_attention_norm.", "post_attention_layernorm."),
              ("final_norm.", "final_layernorm."))  # fmt: skip
# mcore TransformerLayer module registration order; parameters inside a module in LEAVES order.
LAYER_MODULES = (
    "input_layernorm", "self_attention.core_attention", "self_attention.linear_proj", "self_attention.linear_qkv",
    "pre_mlp_layernorm", "mlp.linear_fc1", "mlp.linear_fc2",
)  # fmt: skip
TOP_MODULES = ("output_layer",)
LEAVES = ("layer_norm_weight", "layer_norm_bias", "weight", "bias")


@attrs.frozen
class Naming:
    """How a checkpoint spells parameter keys: `family` legacy or mcore; `te` for mcore with
    Transformer Engine fused norms; `old_norms` for legacy names before Sept 2023."""

    family: str = attrs.field(default="legacy", validator=attrs.validators.in_(FAMILIES))
    te: bool = False
    old_norms: bool = False

    def key(self, key: str) -> str:
        """The checkpoint key (under the chunk) of the parameter with frontend key `key`."""
        if self.family == "legacy":
            if self.old_norms:
                for new, old in _OLD_NORMS:
                    key = key.replace(new, old)
            return key
        layer, module, leaf = self.parts(key)
        return f"{module}.{leaf}" if layer is None else f"decoder.layers.{layer}.{module}.{leaf}"

    def parts(self, key: str) -> tuple[int | None, str, str]:
        """(local layer or None, mcore module, leaf) of a frontend key."""
        m = _LAYER.fullmatch(key)
        if m is None:
            module, _, leaf = _TOP[key].rpartition(".")
            return None, module, leaf
        layer, module, leaf = int(m[1]), m[2], m[3]
        if self.te and module in _TE_NORMS:
            return layer, _TE_NORMS[module], f"layer_norm_{leaf}"
        return layer, _MODULES[module], leaf

    def order(self, params: Sequence[Param]) -> list[Param]:
        """`params` (one chunk, frontend order) in the framework's `named_parameters()` order."""
        if self.family == "legacy":
            return list(params)
        return sorted(params, key=self._rank)

    def _rank(self, param: Param) -> tuple[int, int, int, int]:
        layer, module, leaf = self.parts(param.key)
        if layer is None:
            return (0 if module.startswith("embedding") else 2, 0, 0, 0)
        return (1, layer, LAYER_MODULES.index(module), LEAVES.index(leaf))

    def chunk_keys(self, params: Sequence[Param], extra: frozenset[str], last: bool) -> list[tuple[str, Param | None]]:
        """(checkpoint key, parameter or None for an `_extra_state`) of one chunk in state-dict
        order. `extra` names the modules that save `_extra_state` (`self_attention.linear_qkv`,
        `output_layer`, ...); `last` says whether the chunk holds the output layer module."""
        ordered = self.order(params)
        if self.family == "legacy":
            return [(self.key(p.key), p) for p in ordered]
        parts = [(self.parts(p.key), p) for p in ordered]
        top = [(m.startswith("embedding"), p) for (layer, m, _), p in parts if layer is None]
        out: list[tuple[str, Param | None]] = [(self.key(p.key), p) for emb, p in top if emb]
        layers: dict[int, dict[str, list[Param]]] = {}
        for (layer, module, _), p in parts:
            if layer is not None:
                layers.setdefault(layer, {}).setdefault(module, []).append(p)
        for layer, modules in layers.items():  # ascending local index: `order` sorted them
            for module in LAYER_MODULES:
                out += [(self.key(p.key), p) for p in modules.get(module, [])]
                if module in extra:
                    out.append((f"decoder.layers.{layer}.{module}{EXTRA}", None))
        out += [(self.key(p.key), p) for emb, p in top if not emb]
        if last:
            out += [(f"{module}{EXTRA}", None) for module in TOP_MODULES if module in extra]
        return out


def extra_module(key: str) -> str | None:
    """The module of an mcore `_extra_state` key (layer modules without the layer prefix), or
    None when `key` is not an `_extra_state` of a known module."""
    if not key.endswith(EXTRA):
        return None
    path = key[: -len(EXTRA)]
    m = _MCORE_LAYER.fullmatch(path)
    if m is not None:
        return m[2] if m[2] in LAYER_MODULES else None
    return path if path in TOP_MODULES else None


def detect_naming(keys: Iterable[str]) -> Naming | None:
    """The naming of a chunk's model keys ('/'-joined), or None when they are neither family."""
    keys = list(keys)
    if any(k.startswith(("language_model/", "word_embeddings_for_head/")) for k in keys):
        old = any(".input_layernorm." in k or "final_layernorm." in k for k in keys)
        return Naming("legacy", old_norms=old)
    if any(k.startswith(("decoder.", "embedding.", "output_layer.")) for k in keys):
        return Naming("mcore", te=any(".layer_norm_weight" in k for k in keys))
    return None


def is_chunk_key(key: Any) -> bool:
    """A top-level key holding a model chunk: `model`, or `model0`, `model1`, ... (virtual pipeline)."""
    return isinstance(key, str) and (key == "model" or (key.startswith("model") and key[5:].isdigit()))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {'/'-joined key path: leaf}, in insertion order."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "/"))
        else:
            out[path] = value
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `flatten`."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
