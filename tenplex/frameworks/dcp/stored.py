"""A DCP checkpoint kept in an agent's store instead of files: where it lives and its PTC.

A save under tag T of job J (`storage.StoreWriter`) leaves, in the store of the saving ranks'
host:

    /job/J/T/<device>/<sub-tensor id>               each saved chunk, id `{fqn}@[offsets]`
    /job/J/T/<device>/.values/rank<r>/<fqn>        each bytes entry (a JSON or opaque value)
    /job/J/T/.meta/ptc                             the PTC of the save (`tenplex.ptc/1`)
    /job/J/T/.meta/dcp                             {"job_id", "mapping": {fqn: key path}}

Device d is rank d's device (its partition `rank<d>`), on the host whose agent the rank saved
to. A tag is complete or absent: ranks write under `/job/J/.saving-T` and the coordinator
renames it to T once every rank's chunks and the metadata are in. `Runtime.execute` moves such a
tag into another layout (`dtensor.mesh.dst_ptc`) and writes the same `.meta` for the new tag,
which `storage.StoreReader` then loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dcp.read import DcpIndex, Entry, ptc_of_index
from tenplex.frameworks.dtensor.convert import dtype_name, torch_dtype
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.store.layout import tag_path


def saving_tag(tag: str) -> str:
    return f".saving-{tag}"


def chunk_id(fqn: str, box: Box) -> str:
    return f"{fqn}@[{','.join(map(str, box.start))}]"


def ptc_of_save(metadata: Metadata, written: Mapping[int, list[tuple[str, Box | None]]], hosts: Mapping[int, str],
                where: str) -> PTC:  # fmt: skip
    """The PTC of a save: `written` maps each rank to the (fqn, chunk box or None for bytes)
    it wrote, `hosts` each rank of the job to its host. A save may leave regions unsaved (the
    survivors of a failure save what they hold): a plan from it then fails to compile, and DCP
    refuses to load it. Raises DcpError (naming `where`) when chunks overlap."""
    tensors = []
    for fqn, item in sorted(metadata.state_dict_metadata.items()):
        if isinstance(item, TensorStorageMetadata):
            from tenplex.ir.tensor import TensorMeta

            tensors.append(TensorMeta(fqn, tuple(item.size), dtype_name(item.properties.dtype)))
    entries = tuple(Entry(fqn, box, f"rank{r}", 0, 0) for r, items in sorted(written.items()) for fqn, box in items)
    index = DcpIndex(Path(where), tuple(tensors), entries, {})
    saved = ptc_of_index(index, complete=False)
    parts = {p.id: p for p in saved.partitions}
    ranks = sorted(hosts)
    partitions = tuple(parts.get(f"rank{r}", Partition(f"rank{r}", (), {})) for r in ranks)
    return PTC(saved.tensors, saved.subtensors, partitions, Allocation({f"rank{r}": (r,) for r in ranks}),
               Topology(tuple(Device(r, hosts[r]) for r in ranks)))  # fmt: skip


def metadata_of_ptc(ptc: PTC, mapping: Mapping[str, Any]) -> Metadata:
    """The DCP Metadata of a stored state: each tensor's distinct chunk boxes, each value as a
    bytes entry; `storage_data` maps a chunk to its box (the reader finds an instance of it)."""
    sd: dict[str, Any] = {}
    storage: dict[MetadataIndex, Any] = {}
    for meta in ptc.tensors:
        boxes = sorted({p.global_box for st in ptc.by_tensor[meta.name] for p in st.pieces if p.global_box.volume})
        if not boxes:  # a tensor without elements: one empty chunk, as DCP saves it
            boxes = [meta.box]
        chunks = [ChunkStorageMetadata(torch.Size(b.start), torch.Size(b.shape)) for b in boxes]
        props = TensorProperties(dtype=torch_dtype(meta.dtype))
        sd[meta.name] = TensorStorageMetadata(props, torch.Size(meta.shape), chunks)
        for b in boxes:
            storage[MetadataIndex(meta.name, b.start)] = (list(b.start), list(b.stop))
    for p in ptc.partitions:
        for name, _ in p.values:
            sd.setdefault(name, BytesStorageMetadata())
            storage.setdefault(MetadataIndex(name), None)
    fqns = [k for k in sd]
    planner = {f: tuple(mapping.get(f, (f,))) for f in fqns}
    return Metadata(sd, planner_data=planner, storage_data=storage)


def instances(ptc: PTC) -> dict[tuple[str, Box], list[tuple[int, str, int]]]:
    """(tensor, global box) -> [(device, sub-tensor id, piece index)] of every stored instance."""
    out: dict[tuple[str, Box], list[tuple[int, str, int]]] = {}
    for st in ptc.subtensors:
        for d in ptc.devices_of_subtensor(st.id):
            for i, p in enumerate(st.pieces):
                out.setdefault((st.tensor, p.global_box), []).append((d, st.id, i))
    return out


def check_job(found: Any, job: str, tag: str, job_id: str | None, host: str) -> dict:
    """The `.meta/dcp` record of a tag, checked to belong to this job. Raises DcpError."""
    where = f"store of host {host}: {tag_path(job, tag)}"
    if not isinstance(found, dict) or not isinstance(found.get("mapping"), dict):
        raise DcpError(f"{where}: holds no complete tenplex DCP state (no .meta/dcp record)")
    if job_id is not None and found.get("job_id") != job_id:
        raise DcpError(f"{where}: holds the state of another job (job id {found.get('job_id')!r}, this job's is {job_id!r}); "
                       "refusing to load it")  # fmt: skip
    return found
