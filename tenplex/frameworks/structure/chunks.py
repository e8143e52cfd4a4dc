"""The model chunks of a structure's rank files (tp rank 0 of each stage), and what their keys
alone show: the layers per chunk, the pipeline split, and features structures are not read for.

Invariants: every refusal is a StructureError naming the file and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.names import Naming, is_chunk_key
from tenplex.frameworks.structure.files import StructureError, flat_leaves, tensor_shape

__all__ = ["Chunk", "layer_count", "pipeline_split", "refuse", "stage_chunks"]

_LAYER = re.compile(r"(?:^|[/.])layers\.(\d+)\.")
_REFUSED = {"local_experts": "mixture-of-experts", "mlp.router": "mixture-of-experts", "lm_head": "BERT",
            "binary_head": "BERT", "pooler": "BERT", "tokentype_embeddings": "BERT"}  # fmt: skip


@attrs.frozen(eq=False)
class Chunk:
    """One tp-rank-0 model chunk: its file, key prefix and flat '/'-joined tensor leaves."""

    file: Path
    prefix: str
    flat: Mapping[str, Any]

    def find(self, naming: Naming, key: str) -> tuple[int, ...] | None:
        """The shape of the parameter with frontend key `key`, None when the chunk lacks it."""
        ckey = naming.key(key)
        if ckey not in self.flat:
            return None
        shape = tensor_shape(self.flat[ckey], self.file, (self.prefix, ckey))
        if shape is None:
            raise StructureError(f"{self.file}: key '{self.prefix}/{ckey}' is not a tensor")
        return shape

    def shape(self, naming: Naming, key: str) -> tuple[int, ...]:
        """As `find`, but the key must be there."""
        shape = self.find(naming, key)
        if shape is None:
            raise StructureError(
                f"{self.file}: key '{self.prefix}/{naming.key(key)}' missing (needed to measure the model)"
            )
        return shape


def stage_chunks(file: Path, data: Any) -> list[Chunk]:
    """The model chunks of one rank file, in key order (`model`, or `model0`, `model1`, ...)."""
    if not isinstance(data, dict):
        raise StructureError(f"{file}: holds {type(data).__name__}, expected a checkpoint object")
    keys = sorted((k for k in data if is_chunk_key(k)), key=lambda k: int(k[5:] or 0))
    if not keys:
        raise StructureError(f"{file}: key 'model' missing")
    out = []
    for k in keys:
        if not isinstance(data[k], dict):
            raise StructureError(f"{file}: key '{k}' is not an object")
        out.append(Chunk(file, k, flat_leaves(data[k], file, (k,))))
    return out


def layer_count(chunk: Chunk) -> int:
    found = {int(m[1]) for key in chunk.flat if (m := _LAYER.search(key))}
    if found != set(range(len(found))):
        raise StructureError(
            f"{chunk.file}: key '{chunk.prefix}' holds layers {sorted(found)}, expected 0..{len(found) - 1}"
        )
    return len(found)


def pipeline_split(counts: list[list[int]], file: Path) -> dict[str, Any]:
    """num_layers and the args fields of the pipeline split."""
    per_stage = [sum(c) for c in counts]
    out: dict[str, Any] = {"num_layers": sum(per_stage)}
    if len(counts[0]) > 1:
        if len({n for c in counts for n in c}) > 1:
            raise StructureError(f"{file}: virtual chunks hold {counts} layers; only even splits are supported")
        out["virtual_pipeline_model_parallel_size"] = len(counts[0])
        return out
    if len(set(per_stage)) == 1:
        return out
    if len(per_stage) == 2:  # the frontend gives the last stage the rest
        out["decoder_first_pipeline_num_layers"] = per_stage[0]
        return out
    inner = set(per_stage[1:-1])
    if len(inner) > 1:
        raise StructureError(f"{file}: stages hold {per_stage} layers: only the first and last may differ")
    share = inner.pop()
    if per_stage[0] != share:
        out["decoder_first_pipeline_num_layers"] = per_stage[0]
    if per_stage[-1] != share:
        out["decoder_last_pipeline_num_layers"] = per_stage[-1]
    return out


def refuse(chunks: list[Chunk]) -> None:
    for chunk in chunks:
        for key in chunk.flat:
            for part, what in _REFUSED.items():
                if part in key:
                    raise StructureError(f"{chunk.file}: key '{chunk.prefix}/{key}' belongs to a {what} model, "
                                         f"which structures are not read for")  # fmt: skip
