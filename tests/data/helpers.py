"""Small dataset files and indexes for the data tests, written by hand after the formats' specs."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np

from tenplex.data import DatasetIndex


def raw_index(n: int, sample_bytes: int = 4, name: str = "data.bin", root: str = "") -> DatasetIndex:
    """An index of n equal raw samples back to back in one file (the file need not exist)."""
    offsets = np.arange(n, dtype=np.int64) * sample_bytes
    return DatasetIndex.from_files("raw", root, [(name, n * sample_bytes, offsets, np.full(n, sample_bytes))])


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_npy_samples(path: Path, n: int) -> DatasetIndex:
    """One file of n concatenated .npy samples (sample i = arange(i % 7 + 1) * i) and its index."""
    blobs = [npy_bytes(np.arange(i % 7 + 1, dtype=np.int32) * i) for i in range(n)]
    path.write_bytes(b"".join(blobs))
    lengths = np.array([len(b) for b in blobs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return DatasetIndex.from_files("numpy", str(path.parent), [(path.name, path.stat().st_size, offsets, lengths)])


def megatron_idx(
    lengths: list[int], dtype_code: int, itemsize: int, documents: list[int], modes: bool = False
) -> bytes:
    """`.idx` bytes built field by field from docs/dataset.md §4.1."""
    pointers, pos = [], 0
    for n in lengths:
        pointers.append(pos)
        pos += n * itemsize
    head = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
    head += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(documents))
    body = struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(lengths)}q", *pointers)
    body += struct.pack(f"<{len(documents)}q", *documents)
    return head + body + (bytes(len(lengths)) if modes else b"")


def write_raw_samples(path: Path, n: int, root: str | None = None) -> DatasetIndex:
    """One file of n raw samples of lengths 1..50 (sample i = bytes derived from i) and its index."""
    lengths = np.array([(i * 37) % 50 + 1 for i in range(n)], dtype=np.int64)
    path.write_bytes(b"".join(bytes((i + k) % 256 for k in range(int(lengths[i]))) for i in range(n)))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return DatasetIndex.from_files("raw", root or str(path.parent), [(path.name, path.stat().st_size, offsets, lengths)])
