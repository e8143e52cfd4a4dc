"""Checkpoint formats by name, and which one a directory holds (by the files it must have)."""

from __future__ import annotations

import os
from pathlib import Path

from tenplex.ir.errors import TenplexError

FORMATS = ("tenplex", "megatron", "megatron-dist", "dcp", "deepspeed", "hf")


class FormatError(TenplexError):
    """A directory in no known format, or a conversion that cannot be done."""


def detect(path: str | os.PathLike) -> str:
    """The format of checkpoint directory `path`. Raises FormatError naming the path."""
    p = Path(path)
    if not p.is_dir():
        raise FormatError(f"{p}: not a directory")
    if (p / "ptc.json").is_file():
        return "tenplex"
    if _is_megatron_dist(p):
        return "megatron-dist"
    if (p / ".metadata").is_file():
        return "dcp"
    if any(p.glob("*.distcp")):
        raise FormatError(f"{p}: has .distcp data files but no .metadata: a DCP save that did not finish (.metadata is written last)")
    if (p / "model.safetensors.index.json").is_file() or any(p.glob("*.safetensors")):
        return "hf"
    if (p / "latest_checkpointed_iteration.txt").is_file() or any(p.glob("iter_*")) or (p / "release").is_dir():
        return "megatron"
    if _is_deepspeed(p):
        return "deepspeed"
    if (p / "rank_map.json").is_file():
        return "structure"  # the reference's per-rank structure JSON: a layout without data
    raise FormatError(f"{p}: not a checkpoint tenplex reads (no ptc.json, metadata.json, .metadata, *.safetensors, "
                      "latest_checkpointed_iteration.txt, iter_*/, DeepSpeed's latest or mp_rank_00_model_states.pt, "
                      "or rank_map.json)")  # fmt: skip


def _is_deepspeed(p: Path) -> bool:
    """A DeepSpeed root or tag directory (ZeRO or universal), possibly half-written: the reader
    then names what is missing."""
    marks = ("latest", "latest_universal", "mp_rank_00_model_states.pt", "zero/optimizer_state.pt")
    return any((p / m).is_file() for m in marks) or any(p.glob("*zero_pp_rank_*_optim_states.pt"))


def _is_megatron_dist(p: Path) -> bool:
    """A torch_dist step directory (even half-written: `megatron_dist` says what it lacks), bare
    or named by a Megatron-LM tree's tracker."""
    from tenplex.frameworks.megatron_dist.files import CONFIG, is_dist_step, locate

    if (p / CONFIG).is_file() or (is_dist_step(p) and (p / "common.pt").is_file()):
        return True
    if not (p / "latest_checkpointed_iteration.txt").is_file():
        return False
    try:
        return is_dist_step(locate(p).step)
    except TenplexError:
        return False  # the legacy reader names what is wrong with the tracker
