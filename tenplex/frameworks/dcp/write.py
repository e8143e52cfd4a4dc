"""Write any PTC layout as a PyTorch DCP checkpoint directory, byte for byte as DCP's writer would.

`write_dcp(ptc, arrays, values, out_dir)` plays the part of `torch.distributed.checkpoint.save`
for all of the PTC's partitions at once, in one process, with DCP's public pieces for the plan:
one `SavePlan` of `WriteItem`s per partition (partition i in rank order writes `__{i}_0.distcp`),
`create_default_global_save_plan` for the `Metadata`, and `FileSystemWriter` for `.metadata`.
The data files' bytes are written here, as `FileSystemWriter.write_data` writes them (bytes
entries first, then each chunk's `torch.save` record, in plan order), but each record is built by
`record.tensor_record` without torch: two small headers around the array's own memory, written
with one `writev` (no pickling or copying of the data through torch; only chunks over 4 GiB, whose
zip needs zip64 fields, still go through `torch.save`). The files are byte-identical to DCP's
(tests/frameworks/test_dcp_record.py), so `torch.distributed.checkpoint.load` reads the result
back with its own resharding.

What is written:
- for each tensor, its sub-tensors' piece global boxes, deduplicated: a box held by several
  partitions (replicas) is written once, by the first partition in rank order (as DCP's dedup
  does); boxes that partially overlap are cut into disjoint parts; a tensor without elements
  gets one empty chunk so that `.metadata` lists it;
- each value once, by the first partition that lists it, as a bytes entry (`dtensor.values`);
- `planner_data` = the FQN → nested-key mapping (`mapping`; default: each FQN is a top-level key).

`arrays` may be lazy (`dcp.apply.StreamedArrays`): each chunk's array is looked up only right
before it is written, one item at a time per file; files are written by parallel threads.

`out_dir` is written into a temporary directory beside it and renamed at the end: it is complete
or absent; with `sync` (the default) also after a crash: the tree is made durable with one
`syncfs` before the rename and the rename after it (`tenplex.runtime.checkpoint.swap.sync_tree`). Raises DcpError (an existing out_dir, an incomplete PTC, a missing or mis-shaped
array or value, an I/O error while writing: named with its errno, e.g. `No space left on device
(ENOSPC)`, even where torch's writer wraps it in a RuntimeError).

Invariants:
- the chunks written for a tensor are pairwise disjoint and cover it exactly (what DCP's own
  save validates), each lies inside the piece of the sub-tensor that provides its bytes;
- partition i of `rank_order` writes exactly the file `__{i}_0.distcp` (possibly empty).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from tenplex.frameworks.dcp import record
from tenplex.frameworks.dcp.apply import StreamedArrays
from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dtensor.convert import from_numpy, torch_dtype
from tenplex.frameworks.dtensor.values import bytes_of_value
from tenplex.ir.box import Box, subtract_all
from tenplex.ir.files import atomic_dir, os_error_of, write_failure
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.tensor import ITEMSIZE
from tenplex.runtime.arrays import np_dtype, region
from tenplex.runtime.checkpoint.swap import sync_dir, sync_tree

Source = tuple[str, str | None, int, Box]  # (tensor, sub-tensor id, piece index or -1 for empty, global box)


def rank_order(ptc: PTC) -> list[str]:
    """Partition ids, `rank<r>` ones by r first, then the rest by id: the file order."""
    key = lambda pid: (0, int(pid[4:]), "") if re.fullmatch(r"rank\d+", pid) else (1, 0, pid)  # noqa: E731
    return sorted(ptc.partition_map, key=key)


def plan_chunks(ptc: PTC) -> dict[str, list[Source]]:
    """Partition id -> the chunks it writes (see the module docstring). Pure; deterministic.

    Raises DcpError when the PTC leaves a tensor region uncovered (DCP could not load it)."""
    gaps = ptc.uncovered()
    if gaps:
        name = sorted(gaps)[0]
        raise DcpError(f"tensor {name!r} region {gaps[name][0]} is held by no sub-tensor: cannot write a complete checkpoint")
    pids = rank_order(ptc)
    order = {pid: i for i, pid in enumerate(pids)}
    out: dict[str, list[Source]] = {pid: [] for pid in pids}
    for meta in ptc.tensors:
        held = [(order[ptc.partition_of[st.id]], st.id, i, p.global_box)
                for st in ptc.by_tensor[meta.name] for i, p in enumerate(st.pieces) if p.global_box.volume]  # fmt: skip
        first: dict[Box, tuple[int, str, int]] = {}
        for rank, sid, i, box in sorted(held):
            first.setdefault(box, (rank, sid, i))
        boxes = list(first)
        cut = any(i < j for i, j in overlapping_pairs(boxes, boxes))
        for box in _disjoint(boxes) if cut else boxes:
            # a part lies in the box it was cut from, the first in priority order containing it
            rank, sid, i = first[box] if not cut else next(first[b] for b in first if b.contains(box))
            out[pids[rank]].append((meta.name, sid, i, box))
        if meta.box.volume == 0 and pids:
            holders = [ptc.partition_of[st.id] for st in ptc.by_tensor[meta.name]]
            out[min(holders or pids, key=order.__getitem__)].append((meta.name, None, -1, meta.box))
    return out


def _disjoint(boxes: list[Box]) -> list[Box]:
    """Parts of `boxes` (in priority order) that earlier boxes do not cover."""
    done: list[Box] = []
    for box in boxes:
        parts = [box]
        for d in done:
            parts = subtract_all(parts, d) if parts and d.overlaps(box) else parts
        done += parts
    return done


def write_dcp(ptc: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]],
              out_dir: str | os.PathLike, *, mapping: Mapping[str, tuple] | None = None, sync: bool = True) -> Metadata:  # fmt: skip
    """Write the DCP directory `out_dir` (see the module docstring); returns its Metadata."""
    out = Path(out_dir)
    if out.exists():
        raise DcpError(f"{out}: already exists (refusing to overwrite)")
    plans, data = _plans(ptc, arrays, values)
    with atomic_dir(out, DcpError) as tmp:
        try:
            md = _save(plans, data, tmp, mapping)
            if sync:
                sync_tree(tmp)
        except (OSError, RuntimeError) as e:
            cause = os_error_of(e)
            if cause is None:
                raise
            raise write_failure(out, cause, DcpError) from None
    if sync:
        try:
            sync_dir(out.parent)
        except OSError as e:
            raise write_failure(out.parent, e, DcpError) from None
    return md


def _save(plans: list[SavePlan], data: dict, tmp: Path, mapping: Mapping | None) -> Metadata:
    # DCP's own writer plans the files (`__{i}_0.distcp`) and pickles `.metadata`; the files'
    # bytes are written here (`_write_file`), as its `write_data` would write them
    writer = FileSystemWriter(tmp, single_file_per_rank=True, sync_files=False, overwrite=False)
    writer.set_up_storage_writer(True, rank=0, use_collectives=True)
    plans = [writer.prepare_local_plan(p) for p in plans]
    plans, md = create_default_global_save_plan(plans)
    fqns = md.state_dict_metadata
    md.planner_data = {f: tuple(mapping[f]) if mapping and f in mapping else (f,) for f in fqns}
    plans = writer.prepare_global_plan(plans)
    with ThreadPoolExecutor(max(1, min(len(plans), os.cpu_count() or 1))) as pool:  # files in parallel
        results = list(pool.map(lambda p: _write_file(tmp, p, data), plans))
    writer.finish(md, results)
    return md


def _write_file(tmp: Path, plan: SavePlan, data: dict) -> list[WriteResult]:
    """The plan's file, as DCP's `FileSystemWriter.write_data` writes it with one thread: its
    bytes entries, then each tensor chunk's `torch.save` record (`record.tensor_record`, the
    same bytes), in plan order; each chunk's array is asked for right before it is written."""
    name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
    items = [i for i in plan.items if i.type == WriteItemType.BYTE_IO] + [i for i in plan.items if i.type != WriteItemType.BYTE_IO]
    results = []
    with open(tmp / name, "wb", buffering=0) as f:
        offset = 0
        for item in items:
            got = data[item.index]
            if isinstance(got, bytes):
                _write_all(f.fileno(), [got])
            else:
                _write_chunk(f, *got())
            end = f.tell()
            results.append(WriteResult(item.index, end - offset, _StorageInfo(name, offset, end - offset)))
            offset = end
    return results


def _write_chunk(f: Any, parts: list[np.ndarray], dtype: str, shape: tuple[int, ...]) -> None:
    """One chunk's record at `f`'s position; its bytes are those of the C-contiguous `parts`,
    one after the other (one array, or the source regions that make up a streamed chunk)."""
    if not record.fits(math.prod(shape) * ITEMSIZE[dtype]):  # over 4 GiB: its zip needs zip64 fields, which torch writes
        joined = parts[0] if len(parts) == 1 else np.concatenate([_raw(p) for p in parts]).view(np_dtype(dtype))
        torch.save(from_numpy(joined.reshape(shape), read_only=True), f)
        return
    rec, crc = record.Record(dtype, shape), 0
    raw = [_raw(p) for p in parts]
    for r in raw:
        crc = record.crc32(r, crc)
    _write_all(f.fileno(), [rec.head, *raw, rec.tail(crc)])


def _raw(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write `parts` one after the other at the file's position (writev, resumed after a short write)."""
    views = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
    while views:
        n = os.writev(fd, views[:1024])
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _plans(ptc: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]]) -> tuple[list[SavePlan], dict]:
    chunks = plan_chunks(ptc)
    written: set[str] = set()
    plans, data = [], {}
    for pid in rank_order(ptc):
        items = []
        for name, sid, piece, box in chunks[pid]:
            item, tensor = _tensor_item(ptc, arrays, name, sid, piece, box)
            items.append(item)
            data[item.index] = tensor
        for name, _ in ptc.partition_map[pid].values:
            if name in written:
                continue
            if name not in values.get(pid, {}):
                raise DcpError(f"partition {pid!r}: no value for {name!r}")
            written.add(name)
            index = MetadataIndex(name)
            items.append(WriteItem(index=index, type=WriteItemType.BYTE_IO))
            data[index] = bytes_of_value(values[pid][name])
        plans.append(SavePlan(items))
    return plans, data


def _tensor_item(ptc: PTC, arrays: Mapping[str, np.ndarray], name: str, sid: str | None, piece: int,
                 box: Box) -> tuple[WriteItem, Callable[[], tuple[list[np.ndarray], str, tuple[int, ...]]]]:  # fmt: skip
    """The write item of one chunk and a function that gives its bytes (C-contiguous arrays, one
    after the other), dtype and shape when it is written (so a lazy `arrays` mapping produces
    each array only then; a `StreamedArrays` chunk copied whole from contiguous source regions
    is not produced at all: those regions are written)."""
    meta = ptc.tensor_map[name]

    def data() -> tuple[list[np.ndarray], str, tuple[int, ...]]:
        if sid is None:  # the empty chunk of a tensor without elements
            return [np.empty(meta.shape, dtype=np_dtype(meta.dtype))], meta.dtype, meta.shape
        st = ptc.subtensor_map[sid]
        whole = len(st.pieces) == 1 and box == st.pieces[piece].global_box and box.shape == st.shape
        parts = arrays.parts(sid) if whole and isinstance(arrays, StreamedArrays) else None
        if parts is not None:  # written straight from the source regions, never produced
            return parts, meta.dtype, box.shape
        a = arrays.get(sid)
        if a is None or tuple(a.shape) != st.shape or a.dtype != np_dtype(meta.dtype):
            got = "nothing" if a is None else f"{a.dtype}{list(a.shape)}"
            raise DcpError(f"sub-tensor {sid!r}: array is {got}, expected {meta.dtype}{list(st.shape)}")
        chunk = region(a, st.pieces[piece], box)
        return [chunk if chunk.flags.c_contiguous else chunk.copy(order="C")], meta.dtype, box.shape  # a copy only if not contiguous

    index = MetadataIndex(meta.name, box.start)
    chunk = ChunkStorageMetadata(offsets=torch.Size(box.start), sizes=torch.Size(box.shape))
    props = TensorProperties(dtype=torch_dtype(meta.dtype))
    item = WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=TensorWriteData(chunk, props, torch.Size(meta.shape)))
    return item, data
