"""Megatron-LM legacy checkpoint trees on disk: the tracker, rank directories, loading a rank file.

Tree (docs/conventions.md §1.1-1.2):

    DIR/latest_checkpointed_iteration.txt   an integer iteration or the word `release`
    DIR/iter_{iteration:07d}/               (DIR/release/ for a release checkpoint)
        mp_rank_{tp:02d}/                   when PP == 1
        mp_rank_{tp:02d}_{pp:03d}/          when PP > 1
            model_optim_rng.pt              torch.save of the rank's state dict
            distrib_optim.pt                with the distributed optimizer

Keys inside a file: `names` (flattened to '/'-joined paths of the nested dicts); tensors in
them: `tensors`.

Rank files are unpickled without letting them run code (`megatron.pickles`): `load_file`
refuses a class outside Megatron's allow-list unless the caller passes `trust_pickles=True`.

Invariants:
- every read error is a `CheckpointFormatError` that names the file and, where there is one,
  the key inside it;
- only regular files are opened (a fifo is refused, not waited on);
- `atomic_dir` leaves the output complete or absent: it writes beside it and renames at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.pickles import load_rank_file
from tenplex.ir import files
from tenplex.ir.errors import TenplexError
from tenplex.ir.files import open_regular

TRACKER = "latest_checkpointed_iteration.txt"
MODEL_FILE = "model_optim_rng.pt"
OPTIM_FILE = "distrib_optim.pt"
_RANK_DIR = re.compile(r"mp_rank_\d{2}(_\d{3})*")


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
    with open_regular(path, "not a Megatron checkpoint directory", CheckpointFormatError) as f:
        text = f.read(4096).decode("utf-8", "replace").strip()
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


def load_file(path: Path, what: str, *, trust_pickles: bool = False) -> Any:
    """The object in Megatron file `path`, unpickled with `megatron.pickles`' allow-list (any
    class with `trust_pickles`).

    Raises:
        CheckpointFormatError: the file is missing, not a regular file, not a torch pickle, or
            needs a class outside the allow-list (names the file and the class).
    """
    return load_rank_file(path, what, CheckpointFormatError, trust_pickles=trust_pickles)


def atomic_dir(out: Path) -> contextlib.AbstractContextManager[Path]:
    """`tenplex.ir.files.atomic_dir` raising CheckpointFormatError."""
    return files.atomic_dir(out, CheckpointFormatError)
