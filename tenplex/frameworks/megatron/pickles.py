"""Loading a Megatron rank file without letting it run code: torch's weights-only unpickler plus
an allow-list of the classes Megatron really pickles.

`torch.save` files are pickles, and a pickle can call any function it names. tenplex therefore
reads rank files with `torch.load(weights_only=True)`, which builds tensors, containers and
torch's own types only, and allows (`torch.serialization.safe_globals`) exactly these more:

- `argparse.Namespace` (`args`);
- numpy arrays, dtypes and scalars (`rng_state`'s `np_rng_state`, numpy values in `args`):
  `numpy[._]core.multiarray._reconstruct` and `.scalar`, `numpy.ndarray`, `numpy.dtype`,
  `numpy.dtypes.*DType`, under the names numpy 1 and numpy 2 write;
- enums that Megatron pickles in `args` (`ModelType`, `AttnBackend`, ...): a class of a module
  named `megatron[.*].enums` that is installed here and is an `enum.Enum` (constructing an enum
  member from its value runs no code of the file).

Before loading, the pickle's globals are listed without executing it
(`torch.serialization.get_unsafe_globals_in_checkpoint`); the first one outside the list is
refused with a one-line `CheckpointFormatError` naming the file and the class and how to opt in:
`trust_pickles=True` (`--trust-pickles` on the command line) loads with `weights_only=False`,
as Megatron itself does, for files from a source the user trusts.

Invariants:
- without `trust_pickles`, no function or class outside the list above is called or built;
- only regular files are opened (a fifo is refused, not waited on).
"""

from __future__ import annotations

import argparse
import enum
import importlib
import pickle
import re
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import check_regular, one_line

__all__ = ["OPT_IN", "load_rank_file"]

OPT_IN = "pass --trust-pickles (trust_pickles=True) to load it anyway if you trust the file"
_ENUM_MODULE = re.compile(r"megatron(\.[A-Za-z_]\w*)*\.enums")
_REFUSED = re.compile(r"GLOBAL (\S+) was not an allowed global")


def _static_globals() -> dict[str, Any]:
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    scalar = np.float64(0).__reduce__()[0]
    out: dict[str, Any] = {"argparse.Namespace": argparse.Namespace, "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for core in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[f"{core}._reconstruct"], out[f"{core}.scalar"] = reconstruct, scalar
    for name in dir(np.dtypes):
        cls = getattr(np.dtypes, name)
        if isinstance(cls, type) and issubclass(cls, np.dtype):
            out[f"numpy.dtypes.{name}"] = cls
    return out


_STATIC = _static_globals()


def allowed_global(name: str) -> Any | None:
    """The object the pickle global `module.name` may load as, or None when it is refused."""
    if name in _STATIC:
        return _STATIC[name]
    module, _, attr = name.rpartition(".")
    if not _ENUM_MODULE.fullmatch(module):
        return None
    try:
        obj = vars(sys.modules.get(module) or importlib.import_module(module)).get(attr)
    except Exception:  # noqa: BLE001 (not installed here, or failing to import: refused either way)
        return None
    return obj if isinstance(obj, type) and issubclass(obj, enum.Enum) else None


def load_rank_file(path: Path, what: str, error: type[TenplexError], *, trust_pickles: bool = False,
                   extra: Mapping[str, Any] | None = None) -> Any:  # fmt: skip
    """The object in torch file `path` (see the module docstring). `extra` allows more globals,
    by pickle name, as the given objects (another format's stand-ins for its classes). Raises
    `error` naming the file when it is missing, not a regular file, not a torch file, or needs a
    class that is refused."""
    import torch  # here, not at the top: format detection imports this module and needs no torch

    check_regular(path, what, error)
    zipped = zipfile.is_zipfile(path)
    if trust_pickles:
        return _load(path, error, zipped, weights_only=False)
    known = {**_STATIC, **(extra or {})}
    allowed = [(obj, name) for name, obj in known.items()]
    for name in sorted(_globals(path, error) if zipped else ()):
        obj = known.get(name) or allowed_global(name)
        if obj is None:
            raise error(_refusal(path, name))
        allowed.append((obj, name))
    with torch.serialization.safe_globals(allowed):
        return _load(path, error, zipped, weights_only=True)


def _globals(path: Path, error: type[TenplexError]) -> list[str]:
    """The pickle's globals that torch does not allow by default, read without unpickling."""
    import torch

    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as e:  # noqa: BLE001 (a corrupt zip or pickle, whatever raises)
        raise error(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {one_line(e)})") from None


def _load(path: Path, error: type[TenplexError], zipped: bool, *, weights_only: bool) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=zipped)
    except pickle.UnpicklingError as e:
        refused = _REFUSED.search(str(e))
        if weights_only and refused:  # a legacy (non-zip) file: torch names the global it refused
            raise error(_refusal(path, refused.group(1))) from None
        hint = f"; {OPT_IN}" if weights_only else ""
        raise error(f"{path}: not a readable torch checkpoint (UnpicklingError: {one_line(e, 200)}){hint}") from None
    except Exception as e:  # noqa: BLE001 (torch raises many kinds for a corrupt or foreign file)
        raise error(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {one_line(e)})") from None


def _refusal(path: Path, name: str) -> str:
    return (f"{path}: refusing to unpickle {name!r}: not a class tenplex allows in checkpoint files, and unpickling it "
            f"could run code; {OPT_IN}")  # fmt: skip

