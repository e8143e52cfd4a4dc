"""Dst `.npy` files written straight from a plan: each file once, from the mapped src files.

`PlannedFiles(plan, src, dst, src_arrays)` stands for the dst arrays of a one-host plan without
holding them: `write(sid, fd)` writes dst sub-tensor `sid`'s `.npy` file into the open file
`fd`, from the ops of one of its instances (`apply.ops_by_dst`). `src_arrays` are usually views
of the memory-mapped src files (`npy.map_npy`), so nothing is read before it is copied.

How the bytes go: the header, then each op's region where it lands in the file. A region that is
one run of bytes in the dst array (rows of a row block, a whole array) is copied from the src
file into the dst file by the kernel (`copy_file_range(2)`, as `cp` copies: one copy, no page
mapped in this process) where the src region is one run of a mapped file, else written with
`os.pwrite` from the src array (gathered into the thread's buffer first where it is not one run,
e.g. a column block); a fill run is written from a buffer of its value. A sub-tensor with a region
that is not one run in the dst array (the dst is a column block) is assembled in the scratch
buffer and written with one `pwrite`. Scratch buffers are per thread and reused, so their pages
are faulted in once. Where each region is one run of the dst array, the offsets come from the
boxes (`arrays.run_of`, `arrays.box_run`: integers, no numpy view), and so does a copy's src
offset where its src region is one run of a mapped file; only the other regions (empty ones,
column blocks of the src or of the dst) make views (`_spans`: the same bytes, in the same
places). One path writes every file: runs in file order where every region is one run of the
dst array, else the array assembled.

Invariants:
- every byte of a dst file is written once: ops whose regions do not add up to the array raise
  ExecutionError before the file is written (the plan's verifier proves they tile it);
- only the ops of `ops_by_dst` run: replicas and instances the directory does not store are
  never produced.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tenplex.compiler import CopyOp, FillOp, Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import SubTensor
from tenplex.runtime.arrays import box_run, np_dtype, run_of, view
from tenplex.runtime.checkpoint.apply import apply_ops, ops_by_dst
from tenplex.runtime.checkpoint.npy import mapped_file, npy_header, pwrite_all
from tenplex.runtime.checkpoint.vectored import runs, write_runs
from tenplex.runtime.executor import source_region, target_region

__all__ = ["PlannedFiles", "pwrite_all"]


class PlannedFiles:
    """The dst arrays of `plan`, written file by file (see the module docstring)."""

    preallocated = False  # the files exist already (`prealloc.Preallocation`): opened without O_EXCL

    def __init__(self, plan: Plan, src: PTC, dst: PTC, src_arrays: Mapping):
        self.src, self.src_arrays = src, src_arrays
        self.dst = dst.with_allocation(plan.allocation)
        self.ops = ops_by_dst(plan, self.dst)
        self.local = threading.local()
        self._mapped: dict = {}  # src (sub-tensor, device) -> (file, offset) of its mapped array, or None

    def write(self, sid: str, fd: int) -> None:
        """Write dst sub-tensor `sid`'s `.npy` file (header and data) into `fd` (empty, writable).
        Raises OSError from the writes; ExecutionError, before writing, when the ops' regions
        do not add up to the array (a plan that leaves a byte unwritten)."""
        st = self.dst.subtensor_map[sid]
        dtype = np_dtype(self.dst.tensor_map[st.tensor].dtype)
        header = npy_header(dtype, st.shape)
        ops = self.ops.get(sid, [])
        offsets, sizes, target = self._spans(st, dtype, ops)
        if sum(sizes) != st.volume * dtype.itemsize:
            raise ExecutionError(f"dst sub-tensor {sid!r}: its ops write {sum(sizes)} of {st.volume * dtype.itemsize} bytes")
        pwrite_all(fd, header, 0)
        if None in offsets:  # a region that is not one run of the array (a column block): assembled, written at once
            apply_ops(ops, self.src, self.dst, self.src_arrays, target)
            pwrite_all(fd, _bytes(target), len(header))
            return
        for at, i in sorted(zip(offsets, range(len(ops)))):  # in file order
            op = ops[i]
            if isinstance(op, FillOp):
                pwrite_all(fd, _bytes(np.full(sizes[i] // dtype.itemsize, op.value, dtype)), len(header) + at)
            else:
                self._copy_op(op, fd, len(header) + at)

    def _spans(self, st: SubTensor, dtype: np.dtype, ops: list[CopyOp | FillOp]) -> tuple[list, list[int], np.ndarray | None]:
        """(each op's region's byte offset in the array, its bytes, the scratch array or None).
        The offset comes from the boxes where the region is one run of the array (`arrays.run_of`,
        `arrays.box_run`: no view made), else from its numpy view in the scratch buffer (made
        then: an empty region, one outside the array); it is None where that view is not one
        run, or where the op reads dst state (a forward): the array is then assembled there."""
        offsets: list[int | None] = []
        sizes: list[int] = []
        target = None
        itemsize = dtype.itemsize
        for op in ops:
            if isinstance(op, FillOp):
                at = box_run(st.shape, op.box)
            else:
                at = run_of(st.shape, st.pieces[op.dst_piece], op.box) if op.src_side == "src" else None
            if at is not None:
                offsets.append(at * itemsize)
                sizes.append(op.box.volume * itemsize)
                continue
            if target is None:
                target = self._buffer("scratch", st.volume * itemsize).view(dtype).reshape(st.shape)  # views only, until assembled
            r = self._region(op, target)
            one_run = r.flags.c_contiguous and (isinstance(op, FillOp) or op.src_side == "src")
            offsets.append(r.ctypes.data - target.ctypes.data if one_run else None)
            sizes.append(r.nbytes)
        return offsets, sizes, target

    def _copy_op(self, op: CopyOp, fd: int, at: int) -> None:
        """The copy's bytes at `at`: file to file in the kernel where its src region is one run
        of a mapped src file (offsets from the boxes), else from a view of the src (`_write_view`)."""
        key = (op.src_subtensor, op.src_device)
        a = self.src_arrays[key]
        where = self._mapped.get(key, False)
        if where is False:
            where = self._mapped[key] = mapped_file(a) if a.flags.c_contiguous else None
        k = None if where is None else run_of(a.shape, self.src.subtensor_map[op.src_subtensor].pieces[op.src_piece], op.box)
        if k is None or not copy_range(where[0], where[1] + k * a.itemsize, fd, at, op.box.volume * a.itemsize):
            self._write_view(source_region(op, self.src, self.dst, self.src_arrays, {}), fd, at)

    def _region(self, op: CopyOp | FillOp, target: np.ndarray) -> np.ndarray:
        if isinstance(op, FillOp):
            return view(target, op.box)
        return target_region(op, self.dst, {(op.dst_subtensor, op.dst_device): target})

    def _write_view(self, a: np.ndarray, fd: int, at: int) -> None:
        """`a`'s bytes at `at` from the view itself (the kernel copies a run of a mapped src file
        in `_copy_op`, which calls this for what it cannot: column blocks, unmapped or empty
        regions, files the kernel cannot copy between)."""
        spans = None if a.flags.c_contiguous else runs(a)
        if spans is not None:  # a column block: its rows handed to the kernel as they lie
            write_runs(fd, *spans, at)
            return
        if not a.flags.c_contiguous:  # runs too short for an iovec each: gathered into one run first
            gathered = self._buffer("gather", a.nbytes).view(a.dtype).reshape(a.shape)
            np.copyto(gathered, a)
            a = gathered
        pwrite_all(fd, _bytes(a), at)

    def _buffer(self, name: str, nbytes: int) -> np.ndarray:
        """The calling thread's buffer `name`, at least `nbytes` long (grown, never shrunk)."""
        buf = getattr(self.local, name, None)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), np.uint8)
            setattr(self.local, name, buf)
        return buf[:nbytes]


def copy_range(path: Path, offset: int, fd: int, at: int, n: int) -> bool:
    """Copy `n` bytes of `path` from `offset` to `fd` at `at` with `copy_file_range(2)`; False
    (nothing copied) where the kernel cannot copy between these files. Raises OSError, or
    ExecutionError when `path` ends before `offset + n` (it shrank after it was checked)."""
    if not hasattr(os, "copy_file_range"):  # not Linux
        return False
    src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done = 0
        while done < n:
            try:
                k = os.copy_file_range(src, fd, n - done, offset + done, at + done)
            except OSError as e:
                if done == 0 and e.errno in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    return False
                raise
            if k == 0:
                raise ExecutionError(f"{path}: ends before byte {offset + n} (it changed while being copied)")
            done += k
        return True
    finally:
        os.close(src)


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))
