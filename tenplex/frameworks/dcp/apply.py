"""`StreamedArrays`: a reshard's dst chunks produced one at a time, for DCP's writer.

`reshard_dcp` produces each dst chunk into a per-thread scratch buffer just before DCP's writer
serializes it, so a reshard never holds a second full copy of the state. The plan's ops are
applied by `tenplex.runtime.checkpoint.apply` (`ops_by_dst`, `apply_ops`); no decision is made here.

Invariants: those of `checkpoint.apply`, and a `StreamedArrays` item stays valid until the same
thread asks for the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import numpy as np

from tenplex.compiler import Plan
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.apply import apply_ops, ops_by_dst

__all__ = ["StreamedArrays"]


class StreamedArrays(Mapping[str, np.ndarray]):
    """Dst sub-tensor id -> its array, produced on access into the calling thread's scratch
    buffer (reused: valid until the thread's next access)."""

    def __init__(self, plan: Plan, src: PTC, dst: PTC, src_arrays: Mapping):
        self.src, self.dst, self.src_arrays = src, dst, src_arrays
        self.ops = ops_by_dst(plan, dst)
        self.local = threading.local()

    def __getitem__(self, sid: str) -> np.ndarray:
        st = self.dst.subtensor_map[sid]
        dtype = np_dtype(self.dst.tensor_map[st.tensor].dtype)
        nbytes = st.volume * dtype.itemsize
        scratch = getattr(self.local, "scratch", None)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self.local.scratch = np.empty(max(nbytes, 1), dtype=np.uint8)
        target = scratch[:nbytes].view(dtype).reshape(st.shape)
        apply_ops(self.ops.get(sid, []), self.src, self.dst, self.src_arrays, target)
        return target

    def __iter__(self) -> Iterator[str]:
        return iter(st.id for st in self.dst.subtensors)

    def __len__(self) -> int:
        return len(self.dst.subtensors)
