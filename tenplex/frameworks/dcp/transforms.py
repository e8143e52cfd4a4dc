"""Stream transforms of DCP entries: checkpoints saved with ZStandard compression.

`FileSystemWriter(path, _extensions=[ZStandard()])` (torch.distributed.checkpoint._extension)
pipes each entry's bytes (the `torch.save` of a chunk, or a bytes entry) through the extension's
stream and records `transform_descriptors=["stream.zstd/1"]` in the entry's `_StorageInfo`; the
entry's `offset`/`length` are those of the compressed bytes. DCP's reader undoes the descriptors
in list order. torch 2.13 knows one transform, `stream.zstd` (major version 1): one zstd frame
per entry, written by `zstandard`'s stream writer (so the frame may not state its size).

`check_transforms` reads the descriptors of `.metadata`; `untransformed` returns the original
bytes of every transformed entry of one data file, decompressed from a read-only map of the file
on one thread per core (zstandard releases the GIL while it works). Decompression needs the `zstandard` package (the `zstd` extra); without it a
compressed entry is a `DcpError` saying so. An entry must be one complete frame (truncated or
corrupt ones are refused) that decompresses to at most its tensor's bytes plus `SLACK` (a
`torch.save` archive around the data), a bytes entry to `MAX_BYTES_ENTRY`: a corrupt or hostile
frame cannot fill memory.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from tenplex.frameworks.dcp.format import DcpError
from tenplex.ir.files import one_line
from tenplex.ir.tensor import itemsize

__all__ = ["ZSTD", "check_transforms", "describe_transforms", "untransformed"]

ZSTD = "stream.zstd"
SLACK = 1 << 20
MAX_BYTES_ENTRY = 256 << 20  # a non-tensor value (a step, RNG state, a pickled object)


def check_transforms(path: Path, where: str, descriptors: Any) -> tuple[str, ...]:
    """The transform descriptors of one `.metadata` entry (none: `()`). Raises DcpError naming
    the entry for anything but a list of `stream.zstd/1` descriptors."""
    if not descriptors:
        return ()
    if not isinstance(descriptors, (list, tuple)) or not all(isinstance(d, str) for d in descriptors):
        raise DcpError(f"{path}: {where} has transform_descriptors {descriptors!r}, not a list of strings")
    for d in descriptors:
        name, _, version = d.partition("/")
        if name != ZSTD or version.partition(".")[0] != "1":
            raise DcpError(f"{path}: {where} uses stream transform {d!r}, which tenplex does not read (it reads {ZSTD}/1)")
    return tuple(descriptors)


def untransformed(path: Path, f: BinaryIO, entries: list[Any], dtypes: dict[str, str]) -> dict[str, bytes]:
    """Entry key -> original bytes, for each entry (`read.Entry`) of the open data file `f` that
    has transforms and lies inside the file (the caller reports the others as truncated);
    `dtypes` (tensor name -> dtype) bounds a chunk's size."""
    size = os.fstat(f.fileno()).st_size
    todo = [e for e in entries if e.transforms and e.offset + e.length <= size]
    if not todo:
        return {}
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else contextlib.nullcontext(b"")  # an empty file cannot be mapped
    with mapped as mm, memoryview(mm) as view:

        def one(e: Any) -> bytes:
            limit = MAX_BYTES_ENTRY if e.box is None else math.prod(e.box.shape) * itemsize(dtypes[e.fqn]) + SLACK
            with view[e.offset : e.offset + e.length] as data:
                out = data
                for _ in e.transforms:
                    out = _unzstd(path, f"{e.key} at bytes [{e.offset}, {e.offset + e.length})", out, limit)
                return bytes(out)

        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
            return dict(zip((e.key for e in todo), pool.map(one, todo)))


def _unzstd(path: Path, where: str, data: Any, limit: int) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise DcpError(f"{path}: {where} is compressed with ZStandard (stream.zstd), which needs the zstandard "
                       "package: pip install 'tenplex[zstd]'") from None  # fmt: skip
    try:  # one frame, as DCP reads it; truncated, corrupt or larger than `limit` is an error
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
    except zstandard.ZstdError as e:
        raise DcpError(f"{path}: {where} is not a complete ZStandard frame of at most {limit} bytes ({one_line(e)})") from None


def describe_transforms(entries: list[Any]) -> list[str]:
    """A finding for `tenplex inspect`: how many entries (`read.Entry`) are compressed, if any."""
    n = sum(1 for e in entries if e.transforms)
    return [f"{n} of {len(entries)} entries compressed with ZStandard ({ZSTD}/1): read through zstandard into memory"] if n else []
