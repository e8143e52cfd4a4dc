"""The reference Tenplex's structure directories on disk (docs/reference-tenplex.md §2.3): names, JSON I/O, the
tensor-to-shape conversion, the rank map and the model key order.

A configuration directory (`<framework>/<precision>/<model>/<size>/ppXX/mpXX/dpXX/`) holds:

    rank_map.json                  {"<rank>": {"pp_rank", "mp_rank", "dp_rank"}} for every rank
    model_keys.json                {"<rank>": [[key path], ...]} for every dp_rank-0 rank
    rankNN/mp_rank_MM.json         PP == 1, dp_rank-0 ranks only
    rankNN/mp_rank_MM_PPP.json     PP > 1

A rank file is the torch.load'ed Megatron checkpoint with every tensor replaced by
`{"tensor": [d0, d1, ...]}` (`to_structure`). Key paths are tuples of dict keys (str) and list
indices (int); messages print them '/'-joined.

Invariants (StructureError naming the file and the key):
- a dict holding the key "tensor" is a tensor (the reference's rule) and must be exactly
  `{"tensor": [non-negative ints]}`;
- the rank map numbers every rank 0..N-1 once, its (pp, mp, dp) triples fill the grid, and
  rank = pp·(dp·tp) + dp_rank·tp + mp_rank (Megatron's order: tp fastest, then dp, then pp).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from tenplex.frameworks.megatron.names import is_chunk_key
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.ir.errors import TenplexError
from tenplex.ir.files import one_line, open_regular

RANK_MAP = "rank_map.json"
MODEL_KEYS = "model_keys.json"
NOT_PRIMITIVE = "NotPrimitiveNorTensor"
RANK_DIR = re.compile(r"rank(\d+)")
_AXES = ("pp_rank", "mp_rank", "dp_rank")

Path_ = tuple[str | int, ...]


class StructureError(TenplexError):
    """A structure directory is malformed or disagrees with the layout it describes; names the
    file and the key path."""


@contextlib.contextmanager
def as_structure_error() -> Iterator[None]:
    """Re-raise the Megatron adapter's CheckpointFormatError (same message) as StructureError."""
    try:
        yield
    except CheckpointFormatError as e:
        raise StructureError(str(e)) from None


def key_str(path: Path_) -> str:
    return "/".join(map(str, path))


def rank_dir_name(rank: int) -> str:
    return f"rank{rank:02d}"


def rank_file_name(tp: int, pp: int, pp_size: int) -> str:
    return f"mp_rank_{tp:02d}.json" if pp_size == 1 else f"mp_rank_{tp:02d}_{pp:03d}.json"


def to_structure(value: Any) -> Any:
    """The reference's conversion (`create_value_dict`): tensor -> {"tensor": shape}, dict ->
    dict, list/tuple -> list, None/int/float/str/bool kept, anything else -> NOT_PRIMITIVE."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: to_structure(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return {"tensor": list(value.size())}
    if isinstance(value, (list, tuple)):
        return [to_structure(v) for v in value]
    if isinstance(value, (int, float, str, bool)):
        return value
    return NOT_PRIMITIVE


def tensor_shape(node: Any, file: Path, path: Path_) -> tuple[int, ...] | None:
    """The shape of a tensor node, None for any other node.

    Raises:
        StructureError: a dict with the key "tensor" that is not `{"tensor": [ints >= 0]}`.
    """
    if not isinstance(node, dict) or "tensor" not in node:
        return None
    dims = node["tensor"]
    ok = isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)
    if len(node) != 1 or not ok:
        raise StructureError(f"{file}: key '{key_str(path)}' is {json.dumps(node)[:80]}, expected "
                             f'{{"tensor": [d0, d1, ...]}}')  # fmt: skip
    return tuple(dims)


def tensor_leaves(node: Any, file: Path, path: Path_ = ()) -> Iterator[tuple[Path_, tuple[int, ...]]]:
    """(key path, shape) of every tensor under `node`, in traversal order."""
    shape = tensor_shape(node, file, path)
    if shape is not None:
        yield path, shape
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from tensor_leaves(v, file, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from tensor_leaves(v, file, (*path, i))


def flat_leaves(node: dict, file: Path, path: Path_) -> dict[str, Any]:
    """Nested dicts under `node` -> {'/'-joined key below `path`: leaf}; tensors are leaves."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict) and tensor_shape(v, file, (*path, k)) is None:
            out.update({f"{k}/{sub}": leaf for sub, leaf in flat_leaves(v, file, (*path, k)).items()})
        else:
            out[str(k)] = v
    return out


def model_key_paths(rank_struct: dict, file: Path) -> list[list[str | int]]:
    """model_keys.json's entry for one rank (`find_tensors`): key paths of the tensors under the
    model chunk(s) in traversal order, without those with "rng" in a key."""
    out = []
    for chunk in (k for k in rank_struct if is_chunk_key(k)):
        for path, _ in tensor_leaves(rank_struct[chunk], file, (chunk,)):
            if not any(isinstance(p, str) and "rng" in p for p in path):
                out.append(list(path))
    return out


def load_json(path: Path, what: str) -> Any:
    """The decoded JSON file (NaN allowed: the reference's json.dump writes it).

    Raises:
        StructureError: the file is missing, not a regular file (a fifo is refused, not waited
            on), unreadable or not JSON (with line and column).
    """
    try:
        with open_regular(path, what, StructureError) as f:
            data = f.read()
    except OSError as e:
        raise StructureError(f"{path}: cannot read ({what}): {e.strerror}") from None
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise StructureError(f"{path}: not valid JSON ({what}): {one_line(e)}") from None
    except RecursionError:
        raise StructureError(f"{path}: not valid JSON ({what}): nested too deeply") from None


def dump_json(path: Path, value: Any) -> None:
    """json.dump with indent 4, as the reference writes; int dict keys become strings.

    Raises:
        StructureError: a dict key JSON cannot hold (e.g. a tuple), naming the file.
    """
    try:
        text = json.dumps(value, indent=4)
    except (TypeError, ValueError) as e:
        raise StructureError(f"{path}: cannot be written as JSON: {e}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@attrs.frozen
class RankMap:
    """The (tp, pp, dp) grid of a rank map, numbered in Megatron's order."""

    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, pp: int, tp: int, dp: int = 0) -> int:
        return pp * self.dp * self.tp + dp * self.tp + tp

    def to_json(self) -> dict[str, dict[str, int]]:
        return {str(self.rank(p, t, d)): {"pp_rank": p, "mp_rank": t, "dp_rank": d}
                for p in range(self.pp) for d in range(self.dp) for t in range(self.tp)}  # fmt: skip


def _axes(entry: Any, file: Path, key: str) -> tuple[int, int, int]:
    if not isinstance(entry, dict) or sorted(entry) != sorted(_AXES):
        raise StructureError(f"{file}: key '{key}' is {entry!r}, expected {{pp_rank, mp_rank, dp_rank}}")
    values = tuple(entry[a] for a in _AXES)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise StructureError(f"{file}: key '{key}' is {entry!r}, expected non-negative integer ranks")
    return values  # type: ignore[return-value]


def read_rank_map(file: Path) -> RankMap:
    """The grid of `rank_map.json`.

    Raises:
        StructureError: naming the file and the rank key that is missing, malformed, repeated or
            out of Megatron's order.
    """
    doc = load_json(file, "rank map")
    if not isinstance(doc, dict) or not doc:
        raise StructureError(f'{file}: expected an object {{"<rank>": {{pp_rank, mp_rank, dp_rank}}}}')
    for key in doc:
        if not key.isdigit() or key != str(int(key)) or int(key) >= len(doc):
            raise StructureError(f"{file}: key '{key}' is not a rank in 0..{len(doc) - 1} ({len(doc)} ranks)")
    triples = {int(k): _axes(v, file, k) for k, v in doc.items()}
    grid = RankMap(*(1 + max(t[i] for t in triples.values()) for i in (1, 0, 2)))
    if grid.world != len(doc):
        raise StructureError(f"{file}: {len(doc)} ranks, but the largest ranks give tp={grid.tp} x pp={grid.pp} "
                             f"x dp={grid.dp} = {grid.world} (not a full grid)")  # fmt: skip
    for rank in sorted(triples):
        pp, mp, dp = triples[rank]
        if grid.rank(pp, mp, dp) != rank:
            raise StructureError(f"{file}: key '{rank}' is (pp={pp}, mp={mp}, dp={dp}), which Megatron's order "
                                 f"(tp fastest, then dp, then pp) numbers {grid.rank(pp, mp, dp)}")  # fmt: skip
    return grid


def grid_from_dir_name(config_dir: Path) -> tuple[RankMap | None, str | None]:
    """(grid, precision) named by a `<precision>/<model>/<size>/ppXX/mpXX/dpXX` path, when it
    is one; either is None when the path does not say."""
    names = [p.name for p in (config_dir, *config_dir.parents)][:6]
    m = [re.fullmatch(f"{axis}(\\d+)", n) for axis, n in zip(("dp", "mp", "pp"), names)]
    if len(names) < 3 or not all(m):
        return None, None
    grid = RankMap(tp=int(m[1][1]), pp=int(m[2][1]), dp=int(m[0][1]))  # type: ignore[index]
    precision = names[5] if len(names) == 6 and names[5] in ("fp16", "bf16", "fp32") else None
    return grid, precision
