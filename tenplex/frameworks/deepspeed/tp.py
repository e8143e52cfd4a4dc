"""Which dimension each parameter of a tensor-parallel DeepSpeed checkpoint is split on, learnt
the way DeepSpeed's `ds_to_universal` learns it: from the `universal_checkpoint_info` dict the
model files carry (Megatron-DeepSpeed saves it; a model may set it as an attribute).

Per parameter name (patterns are `re.match`ed, as DeepSpeed does):
- `tp_replicated_parameter_patterns`: every TP rank holds the whole tensor (`None`);
- `parameter_with_row_parallelism_patterns`: split on dim 1 (row-parallel linear weights);
- `vocabulary_parameter_patterns`: split on dim 0 over the padded vocabulary; tenplex keeps the
  padded rows (`padded_vocab_size`), so the padded size must divide by the new TP;
- anything else: split on dim 0 (column-parallel), as `ds_to_universal` concatenates it.
- `UNKNOWN`: no info, or a layout tenplex does not split (averaged parameters, sub-parameters,
  affine maps): each TP rank's tensor is its own, so the DP world size can change but TP cannot.

Invariant: `local_shape(global, dim, tp)` times `tp` on `dim` is `global`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

UNKNOWN = -1
INFO = "universal_checkpoint_info"
_UNSUPPORTED = ("parameter_to_average_patterns", "parameter_with_2_sub_params_cat_dim_0", "parameter_with_sub_params",
                "affine_map")  # fmt: skip


def splits(info: Any, names: Iterable[str], params: set[str]) -> tuple[dict[str, int | None], str]:
    """(name -> split dim, None or UNKNOWN; why a TP change is impossible, or "") for the module
    keys `names`, of which `params` are parameters (buffers are split only if replicated)."""
    names = list(names)
    if not isinstance(info, dict):
        return dict.fromkeys(
            names, UNKNOWN
        ), f"no '{INFO}' in the model files (it says how each parameter splits over TP)"
    replicated = _patterns(info, "tp_replicated_parameter_patterns")
    row = _patterns(info, "parameter_with_row_parallelism_patterns")
    odd = [p for key in _UNSUPPORTED for p in _patterns(info, key)]
    out: dict[str, int | None] = {}
    why = ""
    for n in names:
        if _match(replicated, n):
            out[n] = None
        elif _match(odd, n) or n not in params:
            out[n] = UNKNOWN
            why = why or (f"{n!r} is averaged, fused or affine-mapped ('{INFO}'), which tenplex does not split" if n in params
                          else f"buffer {n!r} is not in tp_replicated_parameter_patterns ('{INFO}')")  # fmt: skip
        else:
            out[n] = 1 if _match(row, n) else 0
    return out, why


def _patterns(info: dict, key: str) -> list[str]:
    value = info.get(key) or []
    if key == "parameter_with_sub_params":
        return [p for s in value for p in (s.get("patterns", []) if isinstance(s, dict) else [])]
    if key == "affine_map":
        return list((value.get("params") or {}).keys()) if isinstance(value, dict) else []
    return [str(p) for p in value]


def _match(patterns: list[str], name: str) -> bool:
    return any(re.match(p, name) for p in patterns)


def local_shape(shape: tuple[int, ...], dim: int | None, tp: int) -> tuple[int, ...]:
    if dim is None or dim == UNKNOWN or tp == 1:
        return shape
    return shape[:dim] + (shape[dim] // tp,) + shape[dim + 1 :]


def global_shape(shape: tuple[int, ...], dim: int | None, tp: int) -> tuple[int, ...]:
    if dim is None or dim == UNKNOWN:
        return shape
    return shape[:dim] + (shape[dim] * tp,) + shape[dim + 1 :]
