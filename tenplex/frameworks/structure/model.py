"""The model and layout of a structure directory, measured from tensor shapes.

The reference saves no usable `args` (a Namespace becomes "NotPrimitiveNorTensor"), so every
fact comes from the shapes of the tp-rank-0 files of each stage (Tp = the rank map's tp):

| fact             | read from                                                                  |
|------------------|----------------------------------------------------------------------------|
| hidden h         | a layer's input norm [h]                                                   |
| norm             | layernorm when the input norm has a bias, else rmsnorm                     |
| num_layers       | distinct local `layers.N` indices, summed over stages (and virtual chunks) |
| ffn f, swiglu    | fc2 (dense_4h_to_h) columns x Tp; fc1 rows are f/Tp, or 2f/Tp with swiglu  |
| Q and KV widths  | np·hn = dense columns x Tp; (np + 2·ng)·hn = QKV rows x Tp                 |
| padded vocab     | word_embeddings rows x Tp (every padded row counts as real unless vocab=)  |
| max_position     | position_embeddings rows (absent: RoPE, a llama-kind model)                |
| tied head        | word_embeddings_for_head (PP > 1) or no output_layer; mcore names with     |
|                  | PP > 1 do not tell (output_layer.weight either way): tied unless tied=     |
| precision        | optimizer: fp32_from_fp16_params with grad_scaler fp16, without it bf16,   |
|                  | neither fp32; no optimizer: `dtype=`, else the path's precision, else fp16 |

Heads cannot be measured. They default to h // 64 (the first multiple of Tp that fits when that
does not divide by Tp); `heads=` overrides. With multi-head attention in Megatron's grouped QKV
layout ([np, 3, hn] rows per rank, checkpoint_version >= 2) the TP split of QKV is contiguous
rows, so any head count Tp divides gives the same shards and the same PTC; heads then matter
only for which target TP degrees fit (TP must divide heads). With grouped-query attention the
head count fixes hn = np·hn / heads and so query_groups = KV width / hn; a wrong guess changes
which TP degrees fit (TP must divide query_groups) and where a TP change would cut a group: pass
`heads=` for GQA models.

The facts become an args-like Namespace for `model_from_args`/`parallel_from_args`, so the
frontend's layout rules are applied, never restated.

Invariants: every refusal is a StructureError naming the file and the key (MoE, BERT, the
distributed optimizer, a layer key missing, shapes that fit no model).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.args import model_from_args, parallel_from_args
from tenplex.frameworks.megatron.meta import cluster_for
from tenplex.frameworks.megatron.names import Naming, detect_naming
from tenplex.frameworks.structure.chunks import Chunk, layer_count, pipeline_split, refuse, stage_chunks
from tenplex.frameworks.structure.files import RankMap, StructureError, as_structure_error
from tenplex.frontends.layout import padded_vocab
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig, fit
from tenplex.ir.errors import SpecError

_PRECISION = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_SHORT = {v: k for k, v in _PRECISION.items()}
_NOTES = {"fp16": "fp16 with fp32 master copies and a grad scaler", "bf16": "bf16 with fp32 master copies",
          "fp32": "fp32 (no master copies)"}  # fmt: skip
ENC = "language_model/encoder"
EMB = "language_model/embedding"


def _check_dtype(value: str | None) -> None:
    if value is not None and value not in _PRECISION and value not in _PRECISION.values():
        raise StructureError(f"dtype={value!r} is not one of {sorted(_PRECISION) + sorted(_PRECISION.values())}")


@attrs.frozen
class Options:
    """What the caller knows that shapes do not say (None = measure or assume)."""

    heads: int | None = None
    vocab: int | None = None
    dtype: str | None = attrs.field(default=None, validator=lambda _, __, v: _check_dtype(v))
    tied: bool | None = None
    path_precision: str | None = None


@attrs.frozen(eq=False)
class Derived:
    model: ModelSpec
    parallel: ParallelConfig  # fitted
    naming: Naming
    precision: str  # fp16 | bf16 | fp32
    notes: tuple[str, ...]


def guess_heads(hidden: int, q: int, kv: int, tp: int) -> int | None:
    """hidden // 64 when it fits, else the smallest multiple of tp that does: tp divides heads
    and query groups, heads divides the Q width, groups divide heads."""
    for heads in dict.fromkeys([hidden // 64, *range(tp, q + 1, tp)]):
        if heads < 1 or heads % tp or q % heads or kv % (q // heads):
            continue
        groups = kv // (q // heads)
        if groups and not heads % groups and not groups % tp:
            return heads
    return None


def _attention(first: Chunk, naming: Naming, j: int, tp: int, options: Options, h: int) -> tuple[dict, list[str]]:
    qkv = first.shape(naming, f"{ENC}/layers.{j}.self_attention.query_key_value.weight")
    proj = first.shape(naming, f"{ENC}/layers.{j}.self_attention.dense.weight")
    q, rows = proj[-1] * tp, qkv[0] * tp
    if (rows - q) % 2 or rows <= q:
        raise StructureError(f"{first.file}: QKV rows {qkv[0]} x tp={tp} and dense columns "
                             f"{proj[-1]} x tp fit no (np + 2·ng)·hn layout")  # fmt: skip
    kv = (rows - q) // 2
    heads, notes = options.heads, []
    if heads is None:
        heads = guess_heads(h, q, kv, tp)
        if heads is None:
            raise StructureError(f"{first.file}: no head count fits Q width {q}, KV width {kv}, tp={tp}; pass heads=")
        why = "hidden/64" if heads == h // 64 else f"hidden/64 = {h // 64} does not fit tp={tp}"
        effect = f"with GQA it sets query_groups = {kv * heads // q}" if kv != q else "with MHA no shard depends on it"
        notes.append(f"heads assumed = {heads} ({why}); {effect}; pass heads= if the model differs")
    if heads < 1 or q % heads or kv % (q // heads):
        raise StructureError(f"{first.file}: heads={heads} does not divide the Q width {q} into heads whose size "
                             f"divides the KV width {kv}")  # fmt: skip
    hn = q // heads
    fields = {"num_attention_heads": heads, "kv_channels": hn, "num_query_groups": kv // hn,
              "group_query_attention": kv != q}  # fmt: skip
    return fields, notes


def _layer_fields(first: Chunk, naming: Naming, j: int, tp: int) -> dict[str, Any]:
    key = f"{ENC}/layers.{j}"
    norm = first.shape(naming, f"{key}.input_norm.weight")
    fc1 = first.shape(naming, f"{key}.mlp.dense_h_to_4h.weight")
    fc2 = first.shape(naming, f"{key}.mlp.dense_4h_to_h.weight")
    if len(norm) != 1 or len(fc1) != 2 or len(fc2) != 2:
        raise StructureError(f"{first.file}: layer {j} norm {norm}, fc1 {fc1}, fc2 {fc2}: expected [h], [f, h], [h, f]")
    if fc1[0] not in (fc2[1], 2 * fc2[1]):
        raise StructureError(f"{first.file}: layer {j} fc1 rows {fc1[0]} are neither fc2 columns {fc2[1]} nor twice "
                             "that (swiglu)")  # fmt: skip
    has = lambda leaf: first.find(naming, f"{key}.{leaf}") is not None  # noqa: E731
    return {"hidden_size": norm[0], "ffn_hidden_size": fc2[1] * tp, "swiglu": fc1[0] == 2 * fc2[1],
            "normalization": "LayerNorm" if has("input_norm.bias") else "RMSNorm",
            "add_bias_linear": has("self_attention.dense.bias"),
            "add_qkv_bias": has("self_attention.query_key_value.bias")}  # fmt: skip


def _embedding(first: Chunk, naming: Naming, tp: int, options: Options) -> tuple[dict, list[str]]:
    word = first.shape(naming, f"{EMB}/word_embeddings/weight")
    pos = first.find(naming, f"{EMB}/position_embeddings/weight")
    padded = word[0] * tp
    fields: dict[str, Any] = {"padded_vocab_size": padded, "make_vocab_size_divisible_by": 128}
    notes = []
    if options.vocab is None:
        notes.append(f"vocab = {padded} padded rows (the true size is not in the files; pass vocab=)")
    elif padded_vocab(options.vocab, tp) != padded:
        raise StructureError(f"{first.file}: key '{first.prefix}/{naming.key(f'{EMB}/word_embeddings/weight')}' has "
                             f"{word[0]} rows x tp={tp} = {padded}, but vocab={options.vocab} pads to "
                             f"{padded_vocab(options.vocab, tp)}")  # fmt: skip
    else:
        fields["vocab_size"] = options.vocab
    if pos is None:
        fields.update(position_embedding_type="rope", add_position_embedding=False)
    else:
        fields.update(position_embedding_type="learned_absolute", max_position_embeddings=pos[0])
    return fields, notes


def _tied(last: Chunk, naming: Naming, pp: int, options: Options) -> tuple[bool, list[str]]:
    head = last.find(naming, "language_model/output_layer/weight") is not None
    copy = last.find(naming, "word_embeddings_for_head/weight") is not None
    if naming.family == "mcore" and pp > 1:  # output_layer.weight is the head copy or an untied head
        tied = True if options.tied is None else options.tied
        note = "" if options.tied is not None else " (mcore names with PP > 1 do not tell; pass tied=)"
        return tied, [f"{'tied' if tied else 'untied'} output layer assumed{note}"] if note else []
    if options.tied is not None and options.tied != (not head):
        raise StructureError(f"{last.file}: tied={options.tied}, but the last stage has "
                             f"{'an' if head else 'no'} untied output_layer")  # fmt: skip
    if head:
        return False, ["untied output_layer on the last stage"]
    return True, ["tied word_embeddings_for_head on the last stage" if copy else "tied embeddings (PP=1: no head copy)"]


def _measured_precision(data: dict) -> str | None:
    opt = data.get("optimizer")
    opt = opt[0] if isinstance(opt, list) and len(opt) == 1 else opt
    if not isinstance(opt, dict):
        return None
    if "fp32_from_fp16_params" in opt:
        return "fp16" if "grad_scaler" in opt else "bf16"
    return "fp32"


def _precision(data: dict, file: Path, options: Options) -> tuple[str, list[str]]:
    found = _measured_precision(data)
    given = [(_SHORT.get(v, v), where) for v, where in ((options.dtype, "dtype="),
             (options.path_precision, "the directory path")) if v is not None]  # fmt: skip
    if found is None:
        if given:
            return given[0][0], [f"{given[0][0]} from {given[0][1]} (no optimizer state shows it)"]
        return "fp16", ["fp16 assumed: no optimizer state and no precision in the path (pass dtype=)"]
    for value, where in given:
        if value != found:
            raise StructureError(f"{file}: key 'optimizer' shows {found} ({_NOTES[found]}), but {where} says {value}")
    return found, [_NOTES[found]]


def derive(stages: list[tuple[Path, Any]], grid: RankMap, options: Options) -> Derived:
    """The model and fitted layout of a structure, from the (file, data) of (pp, tp 0) per stage.

    Raises:
        StructureError: naming the file and key the measurement needs or refuses.
    """
    chunks = [stage_chunks(file, data) for file, data in stages]
    refuse([c for stage in chunks for c in stage])
    first, last, head_file = chunks[0][0], chunks[-1][-1], stages[0][0]
    naming = detect_naming(first.flat)
    if naming is None:
        raise StructureError(
            f"{first.file}: key '{first.prefix}' holds {sorted(first.flat)[:3]}, neither legacy nor mcore names"
        )
    counts = [[layer_count(c) for c in stage] for stage in chunks]
    split = pipeline_split(counts, head_file)
    layered = next((c for stage in chunks for c in stage if layer_count(c)), None)
    if layered is None:
        raise StructureError(f"{head_file}: no stage holds a transformer layer")
    layer = _layer_fields(layered, naming, 0, grid.tp)
    attention, notes = _attention(layered, naming, 0, grid.tp, options, layer["hidden_size"])
    embedding, vocab_notes = _embedding(first, naming, grid.tp, options)
    tied, tied_notes = _tied(last, naming, grid.pp, options)
    precision, precision_notes = _precision(stages[0][1], head_file, options)
    args = argparse.Namespace(
        **split, **layer, **attention, **embedding, untie_embeddings_and_output_weights=not tied,
        fp16=precision == "fp16", bf16=precision == "bf16", optimizer="adam", tensor_model_parallel_size=grid.tp,
        pipeline_model_parallel_size=grid.pp, data_parallel_size=grid.dp, world_size=grid.world,
        use_distributed_optimizer=False,
    )  # fmt: skip
    with as_structure_error():
        model = model_from_args(args, head_file, vocab=options.vocab, optimizer="optimizer" in stages[0][1])
        parallel = parallel_from_args(args, head_file)
    try:
        parallel = fit(model, parallel, cluster_for(parallel))
    except SpecError as e:
        raise StructureError(f"{head_file}: the measured model does not fit tp={grid.tp}, pp={grid.pp}: {e}") from None
    if naming.old_norms:
        notes.append("Megatron 23.06 names (input_layernorm, post_attention_layernorm, final_layernorm)")
    return Derived(model, parallel, naming, precision, tuple(notes + vocab_notes + precision_notes + tied_notes))
