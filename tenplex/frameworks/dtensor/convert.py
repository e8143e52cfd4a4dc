"""torch ↔ tenplex conversions for DTensor state dicts: dtypes, arrays, placements, local shards.

`to_numpy` / `from_numpy` share memory with the tensor or array where the dtype allows (CPU,
every dtype; bfloat16 and float8 go through same-width integer views). `local_shard(dtensor)`
describes a rank's DTensor in torch-free terms (`dtensor.layout.LocalShard`), which is what
`ptc_from_state_dicts` consumes and what a rank can pickle and send elsewhere.

Invariants:
- a dtype's tenplex name is torch's name without `torch.` and is a known IR dtype;
- `_StridedShard` and `Partial` placements are rejected by name (they are not boxes).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.distributed.tensor import Replicate as TorchReplicate
from torch.distributed.tensor import Shard as TorchShard

from tenplex.frameworks.dtensor.boxes import Placement, PlacementError, Replicate, Shard
from tenplex.frameworks.dtensor.layout import LocalShard
from tenplex.ir.tensor import ITEMSIZE
from tenplex.runtime.arrays import EXTRA_DTYPES, np_dtype

_INT_VIEW = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16)}


def dtype_name(dtype: torch.dtype) -> str:
    """tenplex's name of a torch dtype. Raises PlacementError for dtypes the IR lacks."""
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise PlacementError(f"torch dtype {dtype} has no tenplex dtype (known: {', '.join(sorted(ITEMSIZE))})")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The CPU tensor's data as a numpy array of the tenplex dtype (a view when possible)."""
    t = tensor.detach().cpu()
    name = dtype_name(t.dtype)
    if name in EXTRA_DTYPES:  # bfloat16 / float8: no numpy dtype in torch (ml_dtypes kinds vary: float8_e5m2 is "f")
        size = ITEMSIZE[name]
        return t.view(_INT_VIEW[size][0]).numpy().view(np_dtype(name))
    return t.numpy()


def from_numpy(array: np.ndarray, read_only: bool = False) -> torch.Tensor:
    """A CPU tensor sharing the array's memory (copied first when not C-contiguous, or when
    read-only unless the caller only reads the tensor: `read_only=True`)."""
    a = array if array.flags.c_contiguous and (array.flags.writeable or read_only) else array.copy(order="C")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")  # read_only: never written
        if a.dtype.name in EXTRA_DTYPES:
            name = a.dtype.name
            return torch.from_numpy(a.view(_INT_VIEW[a.dtype.itemsize][1])).view(torch_dtype(name))
        return torch.from_numpy(a)


def placement_from_torch(p: object, fqn: str) -> Placement:
    """A torch placement as a tenplex one. Raises PlacementError naming the FQN otherwise."""
    kind = type(p).__name__
    if kind == "_StridedShard":
        raise PlacementError(f"{fqn}: placement {p} (_StridedShard, FSDP2+TP right-to-left sharding) holds non-contiguous rows; redistribute to Shard/Replicate first")
    if isinstance(p, TorchShard):
        return Shard(p.dim)
    if isinstance(p, TorchReplicate):
        return Replicate()
    raise PlacementError(f"{fqn}: placement {p} ({kind}) is not Shard or Replicate; redistribute it first (DCP refuses Partial too)")


def local_shard(dtensor: torch.Tensor, fqn: str, rank: int | None = None) -> LocalShard:
    """Describe a DTensor as `LocalShard` for `rank` (default: this process's rank).

    Raises:
        PlacementError: unsupported placements or a local tensor that contradicts them."""
    mesh = dtensor.device_mesh
    placements = tuple(placement_from_torch(p, fqn) for p in dtensor.placements)
    ranks = tuple(int(r) for r in mesh.mesh.flatten().tolist())
    rank = torch.distributed.get_rank() if rank is None else rank
    array = to_numpy(dtensor.to_local()) if mesh.get_coordinate() is not None else None
    return LocalShard(array, tuple(dtensor.shape), dtype_name(dtensor.dtype), tuple(mesh.shape), placements, ranks, rank)
