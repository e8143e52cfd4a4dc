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

from tenplex.compiler import CopyOp, Plan
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.apply import apply_ops, ops_by_dst
from tenplex.runtime.executor import source_region, target_region

__all__ = ["StreamedArrays"]


class StreamedArrays(Mapping[str, np.ndarray]):
    """Dst sub-tensor id -> its array, produced on access into the calling thread's scratch
    buffer (reused: valid until the thread's next access)."""

    def __init__(self, plan: Plan, src: PTC, dst: PTC, src_arrays: Mapping):
        self.src, self.dst, self.src_arrays = src, dst, src_arrays
        self.ops = ops_by_dst(plan, dst)
        self.local = threading.local()

    def __getitem__(self, sid: str) -> np.ndarray:
        target = self._target(sid)
        apply_ops(self.ops.get(sid, []), self.src, self.dst, self.src_arrays, target)
        return target

    def _target(self, sid: str) -> np.ndarray:
        st = self.dst.subtensor_map[sid]
        dtype = np_dtype(self.dst.tensor_map[st.tensor].dtype)
        nbytes = st.volume * dtype.itemsize
        scratch = getattr(self.local, "scratch", None)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self.local.scratch = np.empty(max(nbytes, 1), dtype=np.uint8)
        return scratch[:nbytes].view(dtype).reshape(st.shape)

    def parts(self, sid: str) -> list[np.ndarray] | None:
        """Dst sub-tensor `sid`'s bytes as views of the source, in order, when its ops copy
        contiguous source regions onto consecutive byte ranges of it that tile it (no fills);
        else None (then `self[sid]` produces it). Nothing is copied."""
        ops = self.ops.get(sid, [])
        if not ops or not all(isinstance(op, CopyOp) for op in ops):
            return None
        target = self._target(sid)  # only its views' offsets are used; it is not written
        spans = []
        for op in ops:
            to = target_region(op, self.dst, {(op.dst_subtensor, op.dst_device): target})
            src = source_region(op, self.src, self.dst, self.src_arrays, {})
            if not (to.flags.c_contiguous and src.flags.c_contiguous):
                return None
            spans.append((to.ctypes.data - target.ctypes.data if to.size else -1, to.nbytes, src))
        at = 0
        for offset, nbytes, _ in sorted((s for s in spans if s[1]), key=lambda s: s[0]):
            if offset != at:
                return None
            at += nbytes
        return [src for offset, nbytes, src in sorted(spans, key=lambda s: s[0]) if nbytes] if at == target.nbytes else None

    def __iter__(self) -> Iterator[str]:
        return iter(st.id for st in self.dst.subtensors)

    def __len__(self) -> int:
        return len(self.dst.subtensors)
