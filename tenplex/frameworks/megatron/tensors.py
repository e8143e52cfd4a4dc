"""torch tensors in Megatron files <-> numpy arrays, dtype, shape and every bit kept (bfloat16
through ml_dtypes). Errors are `CheckpointFormatError`s naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tenplex.frameworks.megatron.tree import CheckpointFormatError
from tenplex.runtime.arrays import np_dtype

__all__ = ["dtype_name", "to_numpy", "to_torch", "torch_dtype"]

_DTYPES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}  # fmt: skip
_TORCH = {name: dt for dt, name in _DTYPES.items()}


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
