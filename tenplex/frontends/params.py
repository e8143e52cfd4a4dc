"""The parameter table: which parameters a pipeline chunk holds, their global names and shapes,
their TP rule, and their Megatron (legacy) state-dict keys.

Global names use the global layer index (`layers.17.mlp.fc1.weight`); keys use the chunk-local
index (`language_model/encoder/layers.3.mlp.dense_h_to_4h.weight`). Parameters come in the
legacy model's `named_parameters()` order, which the distributed optimizer's flat buffer uses.

| global name (layer i)                  | legacy key (local j)                               | shape           | rule       |
|----------------------------------------|----------------------------------------------------|-----------------|------------|
| embedding.word_embeddings.weight       | language_model/embedding/word_embeddings/weight    | [V, h]          | vocab      |
| embedding.position_embeddings.weight   | language_model/embedding/position_embeddings/weight| [max_pos, h]    | replicated |
| embedding.tokentype_embeddings.weight  | language_model/embedding/tokentype_embeddings/weight (bert) | [2, h] | replicated |
| layers.i.input_norm.{weight,bias}      | .../layers.j.input_norm.{weight,bias}              | [h]             | replicated |
| layers.i.self_attention.linear_qkv.*   | .../layers.j.self_attention.query_key_value.*      | [(np+2ng)hn, h] | qkv        |
| layers.i.self_attention.linear_proj.*  | .../layers.j.self_attention.dense.*                | [h, np·hn], [h] | row, repl. |
| layers.i.pre_mlp_norm.{weight,bias}    | .../layers.j.post_attention_norm.{weight,bias}     | [h]             | replicated |
| layers.i.mlp.fc1.*                     | .../layers.j.mlp.dense_h_to_4h.*                   | [f or 2f, h]    | column/glu |
| layers.i.mlp.fc2.*                     | .../layers.j.mlp.dense_4h_to_h.*                   | [h, f], [h]     | row, repl. |
| layers.i.mlp.router.weight (MoE)       | .../layers.j.mlp.router.weight                     | [E, h]          | replicated |
| layers.i.mlp.experts.e.fc1/fc2.*       | .../layers.j.mlp.local_experts.k.dense_h_to_4h/... | as fc1/fc2      | as fc1/fc2 |
| final_norm.{weight,bias}               | language_model/encoder/final_norm.{weight,bias}    | [h]             | replicated |
| output_layer.weight (untied)           | language_model/output_layer/weight                 | [V, h]          | vocab      |
| embedding.word_embeddings.weight (tied head copy, PP > 1) | word_embeddings_for_head/weight | [V, h]   | vocab      |
| pooler.dense.*, lm_head.dense.*, lm_head.norm.*, binary_head.* (bert) | language_model/pooler/dense/*, lm_head/dense/*, lm_head/layernorm/*, binary_head/* | | replicated |
| lm_head.bias (bert)                    | lm_head/bias                                       | [V]             | vocab      |

Norm biases exist with layernorm only; linear biases with bias_linear only.
"""

from __future__ import annotations

import attrs

from tenplex.frontends.layout import Rule
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.pipeline import Chunk

ENCODER = "language_model/encoder"
EMBEDDING = "language_model/embedding"
HEAD_COPY = "word_embeddings_for_head.weight"


@attrs.frozen
class Param:
    """One parameter of a chunk. `label` names its sub-tensors and optimizer keys: the global
    name, except `word_embeddings_for_head.weight` for the tied head copy."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    rule: Rule
    key: str
    label: str = attrs.field(default=attrs.Factory(lambda s: s.name, takes_self=True))
    expert: bool = False  # an expert-parallel parameter (its own distributed-optimizer buffer)
    shared: bool = False  # the tied head copy (its own bucket, as Megatron's shared_embedding)


def _linear(
    model: ModelSpec, name: str, key: str, shape: tuple[int, ...], rule: Rule, bias_rule: Rule, expert: bool = False
) -> list[Param]:
    out = [Param(f"{name}.weight", shape, rule, f"{key}.weight", expert=expert)]
    if model.bias_linear:
        out.append(Param(f"{name}.bias", shape[:1], bias_rule, f"{key}.bias", expert=expert))
    return out


def _norm(model: ModelSpec, name: str, key: str) -> list[Param]:
    out = [Param(f"{name}.weight", (model.hidden,), Rule.REPLICATED, f"{key}.weight")]
    if model.norm_has_bias:
        out.append(Param(f"{name}.bias", (model.hidden,), Rule.REPLICATED, f"{key}.bias"))
    return out


def _mlp(model: ModelSpec, name: str, key: str, expert: bool = False) -> list[Param]:
    h, f = model.hidden, model.ffn_hidden
    fc1_rule = Rule.GLU if model.glu else Rule.COLUMN
    fc1 = _linear(model, f"{name}.fc1", f"{key}.dense_h_to_4h", (model.fc1_rows, h), fc1_rule, fc1_rule, expert)
    return fc1 + _linear(model, f"{name}.fc2", f"{key}.dense_4h_to_h", (h, f), Rule.ROW, Rule.REPLICATED, expert)


def layer_params(model: ModelSpec, layer: int, local: int, experts: range) -> list[Param]:
    """Parameters of global layer `layer` stored as local layer `local`; `experts` are the global
    expert ids this rank holds (ignored for a dense model)."""
    g, k = f"layers.{layer}", f"{ENCODER}/layers.{local}"
    h = model.hidden
    out = _norm(model, f"{g}.input_norm", f"{k}.input_norm")
    out += _linear(
        model,
        f"{g}.self_attention.linear_qkv",
        f"{k}.self_attention.query_key_value",
        (model.qkv_rows, h),
        Rule.QKV,
        Rule.QKV,
    )
    out += _linear(
        model,
        f"{g}.self_attention.linear_proj",
        f"{k}.self_attention.dense",
        (h, model.heads * model.head_dim),
        Rule.ROW,
        Rule.REPLICATED,
    )
    out += _norm(model, f"{g}.pre_mlp_norm", f"{k}.post_attention_norm")
    if not model.num_experts:
        return out + _mlp(model, f"{g}.mlp", f"{k}.mlp")
    out.append(Param(f"{g}.mlp.router.weight", (model.num_experts, h), Rule.REPLICATED, f"{k}.mlp.router.weight"))
    for j, e in enumerate(experts):
        out += _mlp(model, f"{g}.mlp.experts.{e}", f"{k}.mlp.local_experts.{j}", expert=True)
    return out


def _first_params(model: ModelSpec) -> list[Param]:
    h = model.hidden
    out = [
        Param("embedding.word_embeddings.weight", (model.vocab, h), Rule.VOCAB, f"{EMBEDDING}/word_embeddings/weight")
    ]
    if model.max_position:
        out.append(
            Param(
                "embedding.position_embeddings.weight",
                (model.max_position, h),
                Rule.REPLICATED,
                f"{EMBEDDING}/position_embeddings/weight",
            )
        )
    if model.kind == "bert":
        out.append(
            Param(
                "embedding.tokentype_embeddings.weight",
                (2, h),
                Rule.REPLICATED,
                f"{EMBEDDING}/tokentype_embeddings/weight",
            )
        )
    return out


def _pooler(model: ModelSpec) -> list[Param]:
    h = model.hidden
    return [
        Param("pooler.dense.weight", (h, h), Rule.REPLICATED, "language_model/pooler/dense/weight"),
        Param("pooler.dense.bias", (h,), Rule.REPLICATED, "language_model/pooler/dense/bias"),
    ]


def _bert_heads(model: ModelSpec) -> list[Param]:
    h, rep = model.hidden, Rule.REPLICATED
    return [
        Param("lm_head.bias", (model.vocab,), Rule.VOCAB, "lm_head/bias"),
        Param("lm_head.dense.weight", (h, h), rep, "lm_head/dense/weight"),
        Param("lm_head.dense.bias", (h,), rep, "lm_head/dense/bias"),
        Param("lm_head.norm.weight", (h,), rep, "lm_head/layernorm/weight"),
        Param("lm_head.norm.bias", (h,), rep, "lm_head/layernorm/bias"),
        Param("binary_head.weight", (2, h), rep, "binary_head/weight"),
        Param("binary_head.bias", (2,), rep, "binary_head/bias"),
    ]


def _last_params(model: ModelSpec, pp: int) -> list[Param]:
    # Module order of the legacy GPTModel / BertModel: language_model (encoder final norm,
    # pooler, untied output layer), then the tied head copy, then BERT's lm_head and binary_head.
    bert = model.kind == "bert"
    out = _norm(model, "final_norm", f"{ENCODER}/final_norm") + (_pooler(model) if bert else [])
    vocab_shape = (model.vocab, model.hidden)
    if not model.tied_embeddings:
        out.append(Param("output_layer.weight", vocab_shape, Rule.VOCAB, "language_model/output_layer/weight"))
    elif pp > 1:
        out.append(
            Param(
                "embedding.word_embeddings.weight",
                vocab_shape,
                Rule.VOCAB,
                "word_embeddings_for_head/weight",
                label=HEAD_COPY,
                shared=True,
            )
        )
    return out + (_bert_heads(model) if bert else [])


def chunk_params(model: ModelSpec, chunk: Chunk, pp: int, experts: range) -> list[Param]:
    """Parameters of `chunk` (of a pipeline with `pp` stages), in `named_parameters()` order."""
    out = _first_params(model) if chunk.first else []
    for local, layer in enumerate(chunk.layers):
        out += layer_params(model, layer, local, experts)
    return out + (_last_params(model, pp) if chunk.last else [])
