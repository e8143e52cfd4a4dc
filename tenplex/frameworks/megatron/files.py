"""Megatron-LM legacy checkpoint trees on disk: the tracker, rank directories, torch I/O.

Tree (conventions §1.1-1.2):

    DIR/latest_checkpointed_iteration.txt   an integer iteration or the word `release`
    DIR/iter_{iteration:07d}/               (DIR/release/ for a release checkpoint)
        mp_rank_{tp:02d}/                   when PP == 1
        mp_rank_{tp:02d}_{pp:03d}/          when PP > 1
            model_optim_rng.pt              torch.save of the rank's state dict
            distrib_optim.pt                with the distributed optimizer

Keys inside a file are written as '/'-joined paths of the nested dicts, e.g.
`model/language_model/encoder/layers.0.input_norm.weight` (the dots belong to the flat key).

Invariants:
- every read error is a `CheckpointFormatError` that names the file and, where there is one,
  the key inside it;
- `to_numpy` and `to_torch` keep dtype, shape and every bit (bfloat16 through ml_dtypes);
- `atomic_dir` leaves the output complete or absent: it writes beside it and renames at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.ir import files
from tenplex.ir.errors import TenplexError
from tenplex.runtime.arrays import np_dtype

TRACKER = "latest_checkpointed_iteration.txt"
MODEL_FILE = "model_optim_rng.pt"
OPTIM_FILE = "distrib_optim.pt"
_RANK_DIR = re.compile(r"mp_rank_\d{2}(_\d{3})*")
_DTYPES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}  # fmt: skip
_TORCH = {name: dt for dt, name in _DTYPES.items()}


class CheckpointFormatError(TenplexError):
    """A Megatron checkpoint file does not match the layout it claims; names the file and the key."""


@attrs.frozen
class Tree:
    """A checkpoint root and the iteration its tracker names."""

    root: Path
    iteration: int
    release: bool = False

    @property
    def step_dir(self) -> Path:
        return self.root / ("release" if self.release else f"iter_{self.iteration:07d}")

    def rank_dir(self, tp: int, pp: int, pp_size: int) -> Path:
        return self.step_dir / (f"mp_rank_{tp:02d}" if pp_size == 1 else f"mp_rank_{tp:02d}_{pp:03d}")

    def model_file(self, tp: int, pp: int, pp_size: int) -> Path:
        return self.rank_dir(tp, pp, pp_size) / MODEL_FILE

    def optim_file(self, tp: int, pp: int, pp_size: int) -> Path:
        return self.rank_dir(tp, pp, pp_size) / OPTIM_FILE


def open_tree(root: str | os.PathLike) -> Tree:
    """The tree at `root`, from its tracker file.

    Raises:
        CheckpointFormatError: the tracker is missing or holds neither an integer nor `release`,
            or the directory it names is missing.
    """
    path = Path(root) / TRACKER
    if not path.is_file():
        raise CheckpointFormatError(f"{path}: missing (not a Megatron checkpoint directory)")
    text = path.read_text().strip()
    if text == "release":
        tree = Tree(Path(root), 0, True)
    elif text.isdigit():
        tree = Tree(Path(root), int(text))
    else:
        raise CheckpointFormatError(f"{path}: holds {text[:40]!r}, expected an iteration number or 'release'")
    if not tree.step_dir.is_dir():
        raise CheckpointFormatError(f"{tree.step_dir}: missing (named by {path})")
    return tree


def check_rank_dirs(tree: Tree, tp: int, pp: int) -> None:
    """Raises CheckpointFormatError for a rank directory that a tp x pp layout does not have."""
    want = {tree.rank_dir(t, p, pp).name for t in range(tp) for p in range(pp)}
    for entry in sorted(tree.step_dir.iterdir()):
        if _RANK_DIR.fullmatch(entry.name) and entry.name not in want:
            raise CheckpointFormatError(f"{entry}: unexpected rank directory for a checkpoint with tp={tp}, pp={pp}")


def load_file(path: Path, what: str) -> Any:
    """torch.load of a Megatron file (pickled args need weights_only=False: load trusted files only).

    Raises:
        CheckpointFormatError: the file is missing or not a torch pickle.
    """
    if not path.is_file():
        raise CheckpointFormatError(f"{path}: missing ({what})")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # torch raises many kinds for a corrupt or foreign file
        raise CheckpointFormatError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None


def dtype_name(t: torch.Tensor, file: Path, key: str) -> str:
    if t.dtype not in _DTYPES:
        raise CheckpointFormatError(f"{file}: key {key!r} has unsupported dtype {t.dtype}")
    return _DTYPES[t.dtype]


def to_numpy(value: Any, file: Path, key: str) -> np.ndarray:
    """The tensor `value` as a numpy array of the same dtype (a view where torch allows it).

    Raises:
        CheckpointFormatError: `value` is not a tensor, or has a dtype numpy cannot hold.
    """
    if not isinstance(value, torch.Tensor):
        raise CheckpointFormatError(f"{file}: key {key!r} holds {type(value).__name__}, expected a tensor")
    name = dtype_name(value, file, key)
    t = value.detach().cpu().contiguous()
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    return t.numpy()


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A torch tensor holding `array` bit for bit; it shares the (contiguous) array's memory, and
    its storage spans exactly that array, so torch.save writes no neighbouring bytes."""
    a = np.ascontiguousarray(array)
    if a.dtype == np_dtype("bfloat16"):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH[name]


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


def atomic_dir(out: Path) -> contextlib.AbstractContextManager[Path]:
    """`tenplex.ir.files.atomic_dir` raising CheckpointFormatError."""
    return files.atomic_dir(out, CheckpointFormatError)
