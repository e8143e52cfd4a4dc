"""Stream transforms of DCP entries: checkpoints saved with ZStandard compression.

`FileSystemWriter(path, _extensions=[ZStandard()])` (torch.distributed.checkpoint._extension)
pipes each entry's bytes (the `torch.save` of a chunk, or a bytes entry) through the extension's
stream and records `transform_descriptors=["stream.zstd/1"]` in the entry's `_StorageInfo`; the
entry's `offset`/`length` are those of the compressed bytes. DCP's reader undoes the descriptors
in list order. torch 2.13 knows one transform, `stream.zstd` (major version 1): one zstd frame
per entry, written by `zstandard`'s stream writer (so the frame may not state its size).

`check_transforms` reads the descriptors of `.metadata`; `untransformed` returns an entry's
original bytes. Decompression needs the `zstandard` package (the `zstd` extra); without it a
compressed entry is a `DcpError` saying so. An entry may decompress to at most its tensor's
bytes plus `SLACK` (a `torch.save` archive around the data), a bytes entry to `MAX_BYTES_ENTRY`:
a corrupt or hostile frame cannot fill memory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, BinaryIO

from tenplex.frameworks.dcp.format import DcpError
from tenplex.ir.files import one_line
from tenplex.ir.tensor import itemsize

__all__ = ["ZSTD", "check_transforms", "describe_transforms", "untransformed"]

ZSTD = "stream.zstd"
SLACK = 1 << 20
MAX_BYTES_ENTRY = 1 << 30


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


def untransformed(path: Path, f: BinaryIO, key: str, offset: int, length: int, transforms: tuple[str, ...],
                  shape: tuple[int, ...] | None, dtype: str | None) -> bytes:  # fmt: skip
    """The original bytes of entry `key` (stored at [offset, offset + length) of the open file
    `f`), its `transforms` undone; `shape`/`dtype` bound a chunk's size (None: a bytes entry)."""
    f.seek(offset)
    data = f.read(length)
    limit = MAX_BYTES_ENTRY if shape is None else math.prod(shape) * itemsize(dtype) + SLACK
    for _ in transforms:
        data = _unzstd(path, f"{key} at bytes [{offset}, {offset + length})", data, limit)
    return data


def _unzstd(path: Path, where: str, data: bytes, limit: int) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise DcpError(f"{path}: {where} is compressed with ZStandard (stream.zstd), which needs the zstandard "
                       "package: pip install 'tenplex[zstd]'") from None  # fmt: skip
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as e:
        raise DcpError(f"{path}: {where} is not a readable ZStandard stream ({one_line(e)})") from None
    if len(out) > limit:
        raise DcpError(f"{path}: {where} decompresses to more than {limit} bytes, more than its entry can hold")
    return out


def describe_transforms(entries: list[Any]) -> list[str]:
    """A finding for `tenplex inspect`: how many entries (`read.Entry`) are compressed, if any."""
    n = sum(1 for e in entries if e.transforms)
    return [f"{n} of {len(entries)} entries compressed with ZStandard ({ZSTD}/1): read through zstandard into memory"] if n else []
