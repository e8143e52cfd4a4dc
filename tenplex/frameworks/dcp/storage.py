"""`StoreWriter` and `StoreReader`: PyTorch DCP's storage layer, in the host's tenplex store.

Any program written against `torch.distributed.checkpoint` keeps its state in its agent's store
by passing these to DCP's own `save` and `load`:

    store = "/run/tenplex/h0.store"                 # the agent's local socket (`--local`)
    dcp.save(state, storage_writer=StoreWriter(store, job="gpt", tag="step100"))
    dcp.load(state, storage_reader=StoreReader(store, job="gpt", tag="step100"))

DCP plans, deduplicates and reshards as always; these only move bytes. Ranks on several hosts
each pass their own host's socket; after `dcp.save` one rank per host calls `complete_save`. Each rank writes its
chunks into one shared-memory arena that the store adopts without a copy, and reads by mapping
the store's arenas, copying each region once into its tensors. The layout in the store, and
why a tag is complete or absent, is in `stored`. The state is at once visible through the
store's REST API and FUSE view, and `Runtime.execute` can move it into another layout.

`job_id` (optional) marks the state as this job's; a reader given one refuses a tag written with
another. `replace=True` lets a save replace an existing tag (default: refuse).

Raises DcpError / ShmError naming the store's socket, host and tag.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dcp.pinned import REGISTER_READ_ONLY, page_spans, pinned
from tenplex.frameworks.dcp.stored import (
    check_job,
    chunk_id,
    instances,
    metadata_of_ptc,
    ptc_of_save,
    saving_tag,
)
from tenplex.frameworks.dtensor.convert import dtype_name, from_numpy, to_numpy
from tenplex.frameworks.dtensor.values import bytes_of_value, value_from_bytes
from tenplex.ir.box import Box
from tenplex.ir.serialize import ptc_from_json, ptc_to_json
from tenplex.ir.tensor import itemsize
from tenplex.runtime.arrays import region
from tenplex.runtime.shm.client import StoreClient
from tenplex.runtime.store.layout import array_path, meta_path, tag_path, value_path

RECORDS = "tenplex"  # Metadata.storage_data[RECORDS]: the save's `.meta` records


def _box(chunk: Any) -> Box:
    """The global box of a DCP chunk (`ChunkStorageMetadata`: offsets and sizes)."""
    return Box(tuple(chunk.offsets), tuple(o + n for o, n in zip(chunk.offsets, chunk.sizes)))


def _rank(kwargs: dict) -> int:
    if "rank" in kwargs:
        return int(kwargs["rank"])
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _StoreSide:
    def __init__(self, store: str | os.PathLike | StoreClient, job: str, tag: str, job_id: str | None):
        self.client = store if isinstance(store, StoreClient) else StoreClient(store)
        self.job, self.tag, self.job_id = job, tag, job_id
        self.rank = 0

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.tag = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # chosen explicitly, never by a checkpoint id's look


class StoreWriter(_StoreSide, StorageWriter):
    """DCP's storage writer into the tenplex store (see the module docstring)."""

    def __init__(self, store: str | os.PathLike | StoreClient, job: str, tag: str, *, job_id: str | None = None,
                 replace: bool = False):  # fmt: skip
        super().__init__(store, job, tag, job_id)
        self.replace = replace

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank, self.coordinator = _rank(kwargs), is_coordinator
        if is_coordinator and self.client.exists(tag_path(self.job, self.tag)) and not self.replace:
            raise DcpError(f"store of host {self.client.host}: {tag_path(self.job, self.tag)} already exists "
                           "(pass replace=True to replace it)")  # fmt: skip

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if self.coordinator:  # a save that died earlier left its staging behind
            self.client.delete(tag_path(self.job, saving_tag(self.tag)))
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Every chunk of this rank into one new arena (one copy from its tensor), handed to the
        store with the bytes entries as values, all or nothing, under the save's staging tag."""
        staging, device = saving_tag(self.tag), self.rank
        chunks, values, results = [], {}, []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data.read())
                values[value_path(self.job, staging, device, f"rank{device}", item.index.fqn)] = value_from_bytes(raw)
                results.append(WriteResult(item.index, len(raw), ("bytes", device, self.client.host)))
                continue
            box, dtype = _box(item.tensor_data.chunk), dtype_name(item.tensor_data.properties.dtype)
            chunks.append((item, array_path(self.job, staging, device, chunk_id(item.index.fqn, box)), box.shape, dtype))
            results.append(WriteResult(item.index, box.volume * itemsize(dtype), ("chunk", device, self.client.host)))
        filled = self.client.arena({path: (shape, dtype) for _, path, shape, dtype in chunks}, f"tenplex-save-{self.tag}")
        tensors = [planner.resolve_data(item).detach() for item, *_ in chunks]
        on_device = filled.arena.size and any(t.device.type == "cuda" for t in tensors)
        with pinned(page_spans([np.frombuffer(filled.arena.map, np.uint8, filled.arena.size)]) if on_device else []):
            for tensor, (_, path, shape, _) in zip(tensors, chunks):
                if filled.views[path].size:  # one copy, straight from the tensor (CPU or device) into the arena
                    from_numpy(filled.views[path]).copy_(tensor.reshape(shape))
        self.client.put(filled, values)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator, once every rank wrote: the PTC and the record, then the rename."""
        written: dict[int, list] = {}
        hosts: dict[int, str] = {}
        for rank, rank_results in enumerate(results):
            hosts[rank] = self.client.host
            for r in rank_results:
                kind, device, host = r.storage_data
                hosts[device] = host
                box = None
                if kind == "chunk":
                    chunks = metadata.state_dict_metadata[r.index.fqn].chunks
                    box = _box(next(c for c in chunks if tuple(c.offsets) == tuple(r.index.offset)))
                written.setdefault(device, []).append((r.index.fqn, box))
        where = f"store of host {self.client.host}: {tag_path(self.job, self.tag)}"
        ptc = ptc_of_save(metadata, written, hosts, where)
        mapping = {k: list(v) for k, v in (metadata.planner_data or {}).items()}
        # DCP hands `metadata` back to every rank (dcp.save's result): ranks on other hosts
        # complete their host's part of the tag with these records (`complete_save`)
        metadata.storage_data = {RECORDS: {"ptc": ptc_to_json(ptc), "dcp": {"job_id": self.job_id, "mapping": mapping}}}
        complete_save(self.client, self.job, self.tag, metadata, replace=self.replace)

    def storage_meta(self) -> None:
        return None


def complete_save(store: str | os.PathLike | StoreClient, job: str, tag: str, metadata: Metadata, *,
                  replace: bool = False) -> bool:  # fmt: skip
    """Complete this host's part of a save that spans hosts: its ranks' chunks (under the save's
    staging tag) become the tag, with the save's records, which `metadata` (what `dcp.save`
    returned) carries. Call it on one rank per host after `dcp.save`; True if this host had a
    part to complete (the coordinator's host is completed by the save itself)."""
    client = store if isinstance(store, StoreClient) else StoreClient(store)
    records = (metadata.storage_data or {}).get(RECORDS) if isinstance(metadata.storage_data, dict) else None
    if records is None:
        raise DcpError(f"the metadata of {tag_path(job, tag)} holds no tenplex records: not saved with StoreWriter")
    staging = saving_tag(tag)
    if not client.exists(tag_path(job, staging)):
        return False
    client.put(values={meta_path(job, staging, name): record for name, record in records.items()})
    client.rename(tag_path(job, staging), tag_path(job, tag), replace=replace)
    return True


class StoreReader(_StoreSide, StorageReader):
    """DCP's storage reader from the tenplex store (see the module docstring)."""

    def __init__(self, store: str | os.PathLike | StoreClient, job: str, tag: str, *, job_id: str | None = None):
        super().__init__(store, job, tag, job_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        got = self.client.get([meta_path(self.job, self.tag, "ptc"), meta_path(self.job, self.tag, "dcp")]) \
            if self.client.exists(meta_path(self.job, self.tag, "dcp")) else {}  # fmt: skip
        record = check_job(got.get(meta_path(self.job, self.tag, "dcp")), self.job, self.tag, self.job_id, self.client.host)
        self.ptc = ptc_from_json(got[meta_path(self.job, self.tag, "ptc")])
        self.where = {(t, tuple(b.start)): found for (t, b), found in instances(self.ptc).items()}
        return metadata_of_ptc(self.ptc, record["mapping"])

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = _rank(kwargs)
        if not hasattr(self, "ptc"):
            self.read_metadata()
        mine = self.ptc.partition_map.get(f"rank{self.rank}")
        self.device = self.ptc.allocation.devices_of(mine.id)[0] if mine else self.rank

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        sources = dict.fromkeys(self._value(r.storage_index.fqn) if r.type == LoadItemType.BYTE_IO else self._source(r.storage_index)
                                for r in plan.items)  # fmt: skip
        got = self.client.get(list(sources)) if sources else {}
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes_of_value(got[self._value(req.storage_index.fqn)])))
        reads = [r for r in plan.items if r.type != LoadItemType.BYTE_IO]
        targets = [planner.resolve_tensor(r).detach() for r in reads]
        to_device = [got[self._source(r.storage_index)] for r, t in zip(reads, targets) if t.device.type == "cuda"]
        with pinned(page_spans(to_device), REGISTER_READ_ONLY):
            for req, target in zip(reads, targets):
                piece = self._piece(req.storage_index)
                start = tuple(o + s for o, s in zip(req.storage_index.offset, req.storage_offsets))
                sub = region(got[self._source(req.storage_index)], piece, Box(start, tuple(s + n for s, n in zip(start, req.lengths))))
                if target.device.type == "cpu" and target.numel():
                    to_numpy(target)[...] = sub.reshape(tuple(target.shape))
                elif target.numel():  # a device tensor: one copy from the mapped store (contiguous regions as they are)
                    target.copy_(from_numpy(sub, read_only=True).reshape(target.shape))
                planner.commit_tensor(req, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _instance(self, index: MetadataIndex) -> tuple[int, str, int]:
        """The stored instance of a chunk: on this rank's device, else on this host, else any."""
        found = self.where.get((index.fqn, tuple(index.offset)))
        if not found:
            raise DcpError(f"store of host {self.client.host}: {tag_path(self.job, self.tag)} holds no chunk of "
                           f"{index.fqn} at offsets {list(index.offset)}")  # fmt: skip
        here = [f for f in found if self.ptc.topology.host_of(f[0]) == self.client.host]
        return next((f for f in here if f[0] == self.device), (here or found)[0])

    def _source(self, index: MetadataIndex) -> str:
        device, sid, _ = self._instance(index)
        return array_path(self.job, self.tag, self._here(device, f"{index.fqn} at offsets {list(index.offset)}"), sid)

    def _here(self, device: int, what: str) -> int:
        """`device`, checked to be on this store's host (a rank reads its own host's store)."""
        host = self.ptc.topology.host_of(device)
        if host != self.client.host:
            raise DcpError(f"store of host {self.client.host}: {tag_path(self.job, self.tag)} holds {what} on host {host}, "
                           "not here: move the state to this rank's host first (reshard_stored)")  # fmt: skip
        return device

    def _piece(self, index: MetadataIndex) -> Any:
        _, sid, i = self._instance(index)
        return self.ptc.subtensor_map[sid].pieces[i]

    def _value(self, name: str) -> str:
        holders = [(d, p.id) for p in self.ptc.partitions if name in p.value_map for d in self.ptc.allocation.devices_of(p.id)]
        if not holders:
            raise DcpError(f"store of host {self.client.host}: {tag_path(self.job, self.tag)} holds no value {name!r}")
        here = [h for h in holders if self.ptc.topology.host_of(h[0]) == self.client.host]
        device, pid = next((h for h in here if h[0] == self.device), (here or holders)[0])
        return value_path(self.job, self.tag, self._here(device, f"value {name!r}"), pid, name)
