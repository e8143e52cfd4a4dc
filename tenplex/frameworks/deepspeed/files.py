"""The files of a DeepSpeed checkpoint, found, loaded and written without importing DeepSpeed.

Layouts (docs/formats.md, "DeepSpeed"):
- ZeRO-1/2: a tag directory (`global_step{N}`, named by the root's `latest`) holding
  `mp_rank_00_model_states.pt` and one `[bf16_]zero_pp_rank_{dp}_mp_rank_00_optim_states.pt`
  per DP rank (the number after `zero_pp_rank_` is the DP rank);
- universal (`ds_to_universal` output): a tag directory holding `mp_rank_00_model_states.pt`,
  `zero/optimizer_state.pt` and `zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt`, named by the
  root's `latest_universal`.

`locate(path)` accepts the root or the tag directory and returns a `Located` naming every file;
a directory that is neither, or one that lacks a file the other files imply (a half-written
save), raises `DeepSpeedError` in one line naming what is missing.

Pickles: DeepSpeed's optimizer files hold three DeepSpeed classes. tenplex never imports
DeepSpeed; the restricted unpickler (`megatron.pickles.load_rank_file`) maps them to the
stand-ins below, which hold the same data, and `save` pickles the stand-ins back under
DeepSpeed's names, so DeepSpeed loads the real classes. Any other class is refused unless
`trust_pickles`.
"""

from __future__ import annotations

import enum
import os
import pickle
import re
from pathlib import Path
from typing import Any

import attrs
import torch

from tenplex.frameworks.megatron.pickles import load_rank_file
from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.ir.files import os_error_of, read_text, write_failure

MODEL_FILE = "mp_rank_{:02d}_model_states.pt"
_ZERO_FILE = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d\d)_optim_states\.pt")
_MODEL = re.compile(r"mp_rank_(\d\d)_model_states\.pt")
_LAYER = re.compile(r"layer_(\d+)-model_states\.pt")
_OTHER = re.compile(r"layer_\d+-model_\d+-model_states\.pt|zero_pp_rank_\d+_mp_rank_\d\d_model_states\.pt")


class DeepSpeedError(CheckpointFormatError):
    """A DeepSpeed checkpoint tenplex cannot read or write; the message names the file and key."""


class ZeroStageEnum(enum.IntEnum):
    """Stand-in for `deepspeed.runtime.zero.config.ZeroStageEnum`."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class _Saved:
    """A DeepSpeed object as saved: its attributes (pickle state), nothing else."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class fragment_address(_Saved):  # noqa: N801 (DeepSpeed's name: deepspeed.utils.tensor_fragment)
    """Stand-in for DeepSpeed's dataclass: `numel` elements at `start` in the rank's partition."""

    def __init__(self, numel: int, start: int):
        self.numel, self.start = numel, start


class LossScaler(_Saved):
    """Stand-in for DeepSpeed's static `LossScaler` (`cur_scale`, `dynamic`, ...)."""


class DynamicLossScaler(_Saved):
    """Stand-in for DeepSpeed's `DynamicLossScaler` (scale window, hysteresis, ...)."""


_DS_NAMES = {
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStageEnum,
    "deepspeed.utils.tensor_fragment.fragment_address": fragment_address,
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": LossScaler,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": DynamicLossScaler,
}
_BY_CLASS = {cls: name for name, cls in _DS_NAMES.items()}


@attrs.frozen
class Located:
    """The files of one checkpoint: `kind` is "zero" or "universal"; `zero_files[d]` is DP rank
    d's optimizer file of model-parallel rank 0 (ZeRO), `tp` the number of model-parallel ranks
    (`model_file_of(m)`, `zero_files_of(m)`), `params` the universal parameter directories."""

    kind: str
    tag_dir: Path
    model_file: Path
    zero_files: tuple[Path, ...] = ()
    params: tuple[str, ...] = ()
    tp: int = 1  # model-parallel ranks: TP ranks, or pipeline stages when `layers`
    layers: tuple[int, ...] = ()  # a pipeline checkpoint's layer files (`layer_{i:02d}-model_states.pt`)

    def model_file_of(self, m: int) -> Path:
        return self.tag_dir / MODEL_FILE.format(m)

    def layer_file(self, i: int) -> Path:
        return self.tag_dir / f"layer_{i:02d}-model_states.pt"

    def zero_files_of(self, m: int) -> tuple[Path, ...]:
        return tuple(f.with_name(f.name.replace("_mp_rank_00_", f"_mp_rank_{m:02d}_")) for f in self.zero_files)


def locate(path: str | os.PathLike) -> Located:
    """The checkpoint at `path` (a root with `latest`/`latest_universal`, or a tag directory)."""
    p = Path(path)
    for tracker in ("latest_universal", "latest"):
        if (p / tracker).is_file() and not (p / MODEL_FILE.format(0)).exists():
            tag = read_text(p / tracker, DeepSpeedError, f"DeepSpeed {tracker} file").strip()
            if not tag or "/" in tag or tag in (".", ".."):
                raise DeepSpeedError(f"{p / tracker}: names no tag directory ({tag!r})")
            if not (p / tag).is_dir():
                raise DeepSpeedError(f"{p / tracker}: names tag {tag!r}, but {p / tag} is missing")
            return locate(p / tag)
    model = p / MODEL_FILE.format(0)
    if (p / "zero" / "optimizer_state.pt").exists() or ((p / "zero").is_dir() and model.exists()):
        return _universal(p, model)
    names = [f.name for f in _list(p)]
    zero = sorted((m for m in map(_ZERO_FILE.fullmatch, names) if m), key=lambda m: (m.group(3), int(m.group(2))))
    if not model.exists() and not zero:
        raise DeepSpeedError(f"{p}: not a DeepSpeed checkpoint (no latest, {MODEL_FILE.format(0)} or zero_pp_rank_*_optim_states.pt)")
    if not model.exists():
        raise DeepSpeedError(f"{p}: {MODEL_FILE.format(0)} missing (the optimizer files are there: a half-written save?)")
    others = sorted(n for n in names if _OTHER.fullmatch(n))
    if others:
        raise DeepSpeedError(f"{p / others[0]}: ZeRO-3 files and pipelines with tensor parallelism are not read (tenplex "
                             "reads ZeRO-1/2 checkpoints with tensor or pipeline parallelism)")  # fmt: skip
    mps = sorted(int(m.group(1)) for m in map(_MODEL.fullmatch, names) if m)
    if mps != list(range(len(mps))):
        gap = min(set(range(max(mps) + 1)) - set(mps))
        raise DeepSpeedError(f"{p}: {MODEL_FILE.format(gap)} missing (the model files of model-parallel ranks {mps} are there)")
    if not zero:
        raise DeepSpeedError(f"{p}: no zero_pp_rank_*_mp_rank_00_optim_states.pt (saved without optimizer state, or half-written)")
    if {int(m.group(3)) for m in zero} - set(mps) or len({m.group(1) for m in zero}) > 1:
        raise DeepSpeedError(f"{p}: optimizer files {sorted(m.group(0) for m in zero)} name model-parallel ranks without a "
                             "model file, or mix bf16/fp16 prefixes")  # fmt: skip
    prefix = zero[0].group(1) or ""
    n = max(int(m.group(2)) for m in zero) + 1
    for mp in mps:
        have = {int(m.group(2)) for m in zero if int(m.group(3)) == mp}
        if have != set(range(n)):
            missing = min(set(range(n)) - have)
            raise DeepSpeedError(f"{p}: optimizer file of DP rank {missing} missing "
                                 f"({prefix}zero_pp_rank_{missing}_mp_rank_{mp:02d}_optim_states.pt)")  # fmt: skip
    layers = tuple(sorted(int(m.group(1)) for m in map(_LAYER.fullmatch, names) if m))
    return Located("zero", p, model, tuple(p / zero_name(prefix, d, 0) for d in range(n)), tp=len(mps), layers=layers)


def zero_name(prefix: str, dp_rank: int, mp_rank: int) -> str:
    return f"{prefix}zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def _universal(p: Path, model: Path) -> Located:
    for need in (model, p / "zero" / "optimizer_state.pt"):
        if not need.exists():
            raise DeepSpeedError(f"{p}: universal checkpoint without {need.relative_to(p)} (half-written?)")
    params = sorted(d.name for d in _list(p / "zero") if d.is_dir())
    for name in params:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            if not (p / "zero" / name / f"{state}.pt").exists():
                raise DeepSpeedError(f"{p / 'zero' / name}: {state}.pt missing (half-written universal checkpoint?)")
    return Located("universal", p, model, params=tuple(params))


def _list(p: Path) -> list[Path]:
    try:
        return sorted(p.iterdir())
    except OSError as e:
        raise DeepSpeedError(f"{p}: cannot list ({e.strerror})") from None


def load(path: Path, what: str, *, trust_pickles: bool = False) -> Any:
    """The object in torch file `path`, DeepSpeed's classes as the stand-ins above."""
    return load_rank_file(path, what, DeepSpeedError, trust_pickles=trust_pickles, extra=_DS_NAMES)


class _Pickler(pickle._Pickler):  # the Python pickler: its save_global can be overridden
    def save_global(self, obj: Any, name: str | None = None) -> None:
        ds = _BY_CLASS.get(obj)
        if ds is None:
            return super().save_global(obj, name)
        module, _, attr = ds.rpartition(".")
        self.write(pickle.GLOBAL + f"{module}\n{attr}\n".encode())
        self.memoize(obj)


class _PickleModule:
    """The `pickle_module` torch.save uses: the standard module with the pickler above."""

    Pickler = _Pickler
    __name__ = "pickle"

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


def save(obj: Any, path: Path) -> None:
    """torch.save `obj` to `path`, the stand-ins pickled as DeepSpeed's classes."""
    try:
        torch.save(obj, path, pickle_module=_PickleModule())
    except Exception as e:
        err = os_error_of(e)
        if err is not None:
            raise write_failure(path, err, DeepSpeedError) from None
        raise
