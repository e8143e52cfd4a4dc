"""Where a `torch_dist` checkpoint lives on disk, whether it is complete, and its two side files.

Two shapes (docs/formats.md, conventions §1.5):

    DIR/latest_checkpointed_iteration.txt    a Megatron-LM tree: the tracker names the step
    DIR/iter_{iteration:07d}/ (or release/)  directory, which is a dist_checkpointing directory
    STEP/metadata.json                       {"sharded_backend": "torch_dist", ...}: written last
    STEP/common.pt                           torch.save of the non-sharded state (args, iteration)
    STEP/.metadata, STEP/__R_K.distcp        a PyTorch DCP checkpoint of the sharded state

`locate(path)` accepts either shape; `missing(step)` lists what a half-written step directory
lacks (megatron-core writes `metadata.json` after every rank has written its data, so a step
directory without it was never finished). `common.pt` is unpickled with `megatron.pickles`'
allow-list (`trust_pickles` lifts it), as legacy rank files are.

Invariants: every error is a `CheckpointFormatError` naming the file; `write_side_files` writes
into a directory the caller renames into place (it is complete or absent).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.tree import TRACKER, CheckpointFormatError, load_file, open_tree
from tenplex.ir.files import read_json, write_atomic

CONFIG = "metadata.json"
COMMON = "common.pt"
BACKEND = "torch_dist"
PARTS = (CONFIG, COMMON, ".metadata")


@attrs.frozen
class DistDir:
    """A `torch_dist` step directory and, in a Megatron-LM tree, the tree's root and step name."""

    step: Path
    root: Path | None = None

    @property
    def step_name(self) -> str | None:
        return None if self.root is None else self.step.name


def is_dist_step(path: Path) -> bool:
    """Whether `path` looks like a dist_checkpointing step directory (complete or not)."""
    return any((path / name).is_file() for name in PARTS) or any(path.glob("*.distcp"))


def locate(path: str | os.PathLike) -> DistDir:
    """The step directory of a tree (through its tracker) or of a bare directory.

    Raises:
        CheckpointFormatError: the tracker is unreadable or names a missing step directory.
    """
    p = Path(path)
    if (p / TRACKER).is_file():
        return DistDir(open_tree(p).step_dir, p)
    return DistDir(p)


def missing(step: Path) -> list[str]:
    """What a step directory lacks to be a complete `torch_dist` checkpoint, in plain words."""
    out = [name for name in PARTS if not (step / name).is_file()]
    if not any(step.glob("*.distcp")):
        out.append("*.distcp data files")
    if CONFIG not in out:
        backend = read_config(step).get("sharded_backend")
        if backend != BACKEND:
            out.append(f"{CONFIG} naming sharded_backend {BACKEND!r} (it names {backend!r})")
    return out


def check_complete(step: Path) -> None:
    """Raises CheckpointFormatError, one line naming what `step` lacks, if anything."""
    lacking = missing(step)
    if lacking:
        raise CheckpointFormatError(f"{step}: not a complete Megatron torch_dist checkpoint: missing {', '.join(lacking)}"
                                    + (" (megatron-core writes metadata.json last: the save did not finish)"
                                       if lacking[0] == CONFIG and len(lacking) == 1 else ""))  # fmt: skip


def read_config(step: Path) -> dict[str, Any]:
    """`metadata.json` as a dict. Raises CheckpointFormatError when it is not a JSON object."""
    doc = read_json(step / CONFIG, CheckpointFormatError, "dist_checkpointing config")
    if not isinstance(doc, dict):
        raise CheckpointFormatError(f"{step / CONFIG}: holds {type(doc).__name__}, expected a JSON object")
    return doc


def read_common(step: Path, *, trust_pickles: bool = False) -> dict[str, Any]:
    """`common.pt`: the non-sharded state (args, iteration, optimizer param groups, ...)."""
    common = load_file(step / COMMON, "common state", trust_pickles=trust_pickles)
    if not isinstance(common, dict):
        raise CheckpointFormatError(f"{step / COMMON}: holds {type(common).__name__}, expected a dict")
    return common


def write_side_files(step: Path, config: dict[str, Any], common: dict[str, Any]) -> None:
    """`metadata.json` and `common.pt` into `step` (a directory being built)."""
    import torch  # here, not at the top: format detection imports this module and needs no torch

    torch.save(common, step / COMMON)
    write_atomic(step / CONFIG, json.dumps(config))


def write_tracker(root: Path, step_name: str) -> None:
    """The tracker naming `step_name` (`iter_0000010` or `release`) in tree root `root`."""
    write_atomic(root / TRACKER, "release" if step_name == "release" else str(int(step_name.removeprefix("iter_"))))
