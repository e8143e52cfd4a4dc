"""Megatron GPT tensor names and layouts <-> Hugging Face transformers names, one table per architecture.

A pure, data-driven map between whole (consolidated) tensors: `to_hf(arch, dims, tensors)` takes
Megatron's tensors under tenplex's global names (the frontend's: `layers.3.mlp.fc1.weight`; a
`torch_dist` key is first spelled that way by `megatron_name`) and returns the transformers
state dict; `from_hf` is its inverse. Only numpy slicing: every output element is an input
element, bit for bit, in its dtype (bf16 stays bf16).

`LLAMA` (`LlamaForCausalLM`; Megatron's `--normalization RMSNorm --swiglu
--position-embedding-type rope --group-query-attention --untie-embeddings-and-output-weights
--disable-bias-linear`):

| Megatron (tenplex global name)                | transformers                                         | how        |
|-----------------------------------------------|------------------------------------------------------|------------|
| embedding.word_embeddings.weight [Vp, h]      | model.embed_tokens.weight [V, h]                     | vocab      |
| layers.i.input_norm.weight                    | model.layers.i.input_layernorm.weight                | copy       |
| layers.i.self_attention.linear_qkv.weight     | model.layers.i.self_attn.{q,k,v}_proj.weight         | qkv        |
| layers.i.self_attention.linear_proj.weight    | model.layers.i.self_attn.o_proj.weight               | copy       |
| layers.i.pre_mlp_norm.weight                  | model.layers.i.post_attention_layernorm.weight       | copy       |
| layers.i.mlp.fc1.weight [2f, h]               | model.layers.i.mlp.{gate,up}_proj.weight             | glu        |
| layers.i.mlp.fc2.weight                       | model.layers.i.mlp.down_proj.weight                  | copy       |
| final_norm.weight                             | model.norm.weight                                    | copy       |
| output_layer.weight [Vp, h]                   | lm_head.weight [V, h]                                | vocab      |

- qkv: Megatron stores, per query group g, the rows [q heads of g (np/ng of them); k_g; v_g]
  (`hn` rows each; conventions §2.2); q_proj is every group's q heads in order, k_proj the k
  heads, v_proj the v heads. Megatron's RoPE is the non-interleaved `rotate_half` one, as HF
  Llama's: no row permutation.
- glu: the canonical fc1 is [W; V] (gate rows, then up rows; §2.3: tenplex's logical tensor and
  `torch_dist` both hold it so, whatever the TP): gate_proj = W, up_proj = V.
- vocab: the first V rows of the padded Vp (Megatron pads per TP, §2.4); `from_hf` pads with
  zeros to Vp, as Megatron's loader fills a padded vocabulary.

`megatron_name(key)` and `dist_key(name)` translate between `torch_dist` keys (megatron-core saves
the local spec's norms under the TE names: `self_attention.linear_qkv.layer_norm_weight`,
`mlp.linear_fc1.layer_norm_weight`; a layer stack `decoder.layers.<name>` has a leading axis L)
and the global names.

Raises `MapError` naming the tensor: a missing or unexpected tensor, a shape that disagrees
with the dimensions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs
import numpy as np

from tenplex.frameworks.hf.errors import HfError

__all__ = ["ARCHS", "LLAMA", "Dims", "MapError", "Row", "from_hf", "map_names", "dist_key", "megatron_name", "to_hf"]


class MapError(HfError):
    """Tensors that do not fit an architecture's map."""


@attrs.frozen
class Dims:
    """The sizes the map needs (Megatron's names in comments)."""

    layers: int  # num_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    groups: int  # num_query_groups (heads without GQA)
    head_dim: int  # kv_channels
    ffn: int  # ffn_hidden_size
    vocab: int  # the tokenizer's V
    padded_vocab: int  # padded_vocab_size (Vp >= V)


@attrs.frozen
class Row:
    """One Megatron tensor (`{i}`: the layer) and the transformers tensor(s) it becomes by `how`."""

    megatron: str
    hf: tuple[str, ...]
    how: str = "copy"  # copy | qkv | glu | vocab


LLAMA = (
    Row("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),
    Row("layers.{i}.input_norm.weight", ("model.layers.{i}.input_layernorm.weight",)),
    Row(
        "layers.{i}.self_attention.linear_qkv.weight",
        (
            "model.layers.{i}.self_attn.q_proj.weight",
            "model.layers.{i}.self_attn.k_proj.weight",
            "model.layers.{i}.self_attn.v_proj.weight",
        ),
        "qkv",
    ),  # fmt: skip
    Row("layers.{i}.self_attention.linear_proj.weight", ("model.layers.{i}.self_attn.o_proj.weight",)),
    Row("layers.{i}.pre_mlp_norm.weight", ("model.layers.{i}.post_attention_layernorm.weight",)),
    Row(
        "layers.{i}.mlp.fc1.weight",
        ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
        "glu",
    ),
    Row("layers.{i}.mlp.fc2.weight", ("model.layers.{i}.mlp.down_proj.weight",)),
    Row("final_norm.weight", ("model.norm.weight",)),
    Row("output_layer.weight", ("lm_head.weight",), "vocab"),
)
ARCHS = {"llama": LLAMA}

# `torch_dist` keys (megatron-core; local-spec norms are saved under the TE names) -> global names
_DIST_LAYER = {
    "self_attention.linear_qkv.layer_norm_weight": "input_norm.weight", "input_layernorm.weight": "input_norm.weight",
    "self_attention.linear_qkv.weight": "self_attention.linear_qkv.weight",
    "self_attention.linear_proj.weight": "self_attention.linear_proj.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_norm.weight", "pre_mlp_layernorm.weight": "pre_mlp_norm.weight",
    "mlp.linear_fc1.weight": "mlp.fc1.weight", "mlp.linear_fc2.weight": "mlp.fc2.weight",
}  # fmt: skip
_DIST_TOP = {"decoder.final_layernorm.weight": "final_norm.weight", "decoder.final_norm.weight": "final_norm.weight",
             "embedding.word_embeddings.weight": "embedding.word_embeddings.weight",
             "output_layer.weight": "output_layer.weight"}  # fmt: skip
_INDEXED = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


# global names -> the `torch_dist` keys megatron-core saves (norms under the TE names, as its local spec does)
DIST_KEYS = {"input_norm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "pre_mlp_norm.weight": "mlp.linear_fc1.layer_norm_weight",
             **{v: k for k, v in _DIST_LAYER.items() if "norm" not in k}}  # fmt: skip
DIST_TOP = {"final_norm.weight": "decoder.final_layernorm.weight", "embedding.word_embeddings.weight":
            "embedding.word_embeddings.weight", "output_layer.weight": "output_layer.weight"}  # fmt: skip


def dist_key(name: str) -> tuple[str, int | None]:
    """(`torch_dist` key, layer or None) of a global name: `layers.3.mlp.fc1.weight` ->
    (`decoder.layers.mlp.linear_fc1.weight`, 3), a layer stack's key; the inverse of `megatron_name`."""
    if name in DIST_TOP:
        return DIST_TOP[name], None
    _, layer, rest = name.split(".", 2)
    return f"decoder.layers.{DIST_KEYS[rest]}", int(layer)


def megatron_name(key: str) -> tuple[str, bool] | None:
    """(global name, stacked) of a `torch_dist` model key: `stacked` when the key is a layer stack
    (`decoder.layers.<name>`, leading axis L) and the name holds `{i}`; None for a key the map
    does not know (optimizer state, `_extra_state`, ...)."""
    if key in _DIST_TOP:
        return _DIST_TOP[key], False
    m = _INDEXED.fullmatch(key)
    if m is not None and m[2] in _DIST_LAYER:
        return f"layers.{m[1]}.{_DIST_LAYER[m[2]]}", False
    rest = key.removeprefix("decoder.layers.")
    return (f"layers.{{i}}.{_DIST_LAYER[rest]}", True) if rest != key and rest in _DIST_LAYER else None


def map_names(arch: str, dims: Dims) -> list[tuple[str, str]]:
    """(Megatron global name, transformers name) of every transformers tensor of `arch`."""
    return [(src, hf) for src, dst, _ in _rows(ARCHS[arch], dims) for hf in dst]


def _rows(table: tuple[Row, ...], dims: Dims) -> list[tuple[str, tuple[str, ...], str]]:
    out = []
    for row in table:
        layers = range(dims.layers) if "{i}" in row.megatron else (None,)
        for i in layers:
            out.append((row.megatron.format(i=i), tuple(h.format(i=i) for h in row.hf), row.how))
    return out


def _qkv_view(a: np.ndarray, dims: Dims) -> np.ndarray:
    per = dims.heads // dims.groups
    return a.reshape(dims.groups, per + 2, dims.head_dim, *a.shape[1:])


def _split(how: str, a: np.ndarray, dims: Dims) -> tuple[np.ndarray, ...]:
    if how == "qkv":
        g = _qkv_view(a, dims)
        per, rest = dims.heads // dims.groups, a.shape[1:]
        q, k, v = g[:, :per], g[:, per], g[:, per + 1]
        return tuple(np.ascontiguousarray(x).reshape(-1, *rest) for x in (q, k, v))
    if how == "glu":
        return a[: dims.ffn], a[dims.ffn :]
    return (a[: dims.vocab],) if how == "vocab" else (a,)


def _join(how: str, parts: tuple[np.ndarray, ...], dims: Dims) -> np.ndarray:
    if how == "qkv":
        q, k, v = parts
        per, rest = dims.heads // dims.groups, q.shape[1:]
        g = [q.reshape(dims.groups, per, dims.head_dim, *rest), k.reshape(dims.groups, 1, dims.head_dim, *rest),
             v.reshape(dims.groups, 1, dims.head_dim, *rest)]  # fmt: skip
        return np.concatenate(g, axis=1).reshape(-1, *rest)
    if how == "glu":
        return np.concatenate(parts)
    if how == "vocab":
        (a,) = parts
        return np.concatenate([a, np.zeros((dims.padded_vocab - a.shape[0], *a.shape[1:]), a.dtype)])
    return parts[0]


def _rows_of(how: str, dims: Dims) -> tuple[int | None, tuple[int | None, ...]]:
    """(rows of the Megatron tensor, rows of each transformers tensor) that `how` needs (None: any)."""
    hn = dims.head_dim
    if how == "qkv":
        return (dims.heads + 2 * dims.groups) * hn, (dims.heads * hn, dims.groups * hn, dims.groups * hn)
    if how == "glu":
        return 2 * dims.ffn, (dims.ffn, dims.ffn)
    return (dims.padded_vocab, (dims.vocab,)) if how == "vocab" else (None, (None,))


def _check(
    names: tuple[str, ...], arrays: tuple[np.ndarray, ...], rows: tuple[int | None, ...], how: str, where: str
) -> None:
    for name, a, want in zip(names, arrays, rows):
        if want is not None and (a.ndim == 0 or a.shape[0] != want):
            raise MapError(f"{where}: tensor {name!r} has shape {list(a.shape)}; the {how} map needs {want} rows "
                           "(from the model's dimensions)")  # fmt: skip


def _apply(pairs: list[tuple[str, tuple[str, ...], str]], tensors: Mapping[str, np.ndarray], forward: bool,
           dims: Dims, where: str) -> dict[str, np.ndarray]:  # fmt: skip
    known = {n for src, dst, _ in pairs for n in ((src,) if forward else dst)}
    extra = sorted(set(tensors) - known)
    if extra:
        raise MapError(f"{where}: tensor {extra[0]!r} (and {len(extra) - 1} more) has no place in the map")
    out: dict[str, np.ndarray] = {}
    for src, dst, how in pairs:
        names = (src,) if forward else dst
        missing = [n for n in names if n not in tensors]
        if missing:
            raise MapError(f"{where}: tensor {missing[0]!r} is missing")
        arrays = tuple(np.asarray(tensors[n]) for n in names)
        whole, parts = _rows_of(how, dims)
        _check(names, arrays, (whole,) if forward else parts, how, where)
        if forward:
            out.update(zip(dst, _split(how, arrays[0], dims)))
        else:
            out[src] = _join(how, arrays, dims)
    return out


def to_hf(arch: str, dims: Dims, tensors: Mapping[str, np.ndarray], where: str = "source") -> dict[str, np.ndarray]:
    """The transformers state dict of Megatron's whole tensors `tensors` (global names)."""
    return _apply(_rows(ARCHS[arch], dims), tensors, True, dims, where)


def from_hf(arch: str, dims: Dims, tensors: Mapping[str, np.ndarray], where: str = "source") -> dict[str, np.ndarray]:
    """Megatron's whole tensors (global names, vocabulary padded to Vp with zeros) of a
    transformers state dict: the inverse of `to_hf`."""
    return _apply(_rows(ARCHS[arch], dims), tensors, False, dims, where)
