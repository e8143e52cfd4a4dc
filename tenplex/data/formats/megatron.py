"""Megatron-LM indexed datasets: a `.bin` of concatenated token sequences and an `.idx` index.

`.idx` layout (little-endian): magic `b"MMIDIDX\\x00\\x00"` (9 bytes), version uint64 = 1, dtype
code uint8, sequence count S uint64, document count D+1 uint64, then int32 sequence lengths [S],
int64 byte pointers into `.bin` [S], int64 document indices [D+1], and for multimodal datasets
int8 sequence modes [S]. One tenplex sample is one sequence: `.bin` bytes
`[pointer, pointer + length x itemsize)`.

Invariants checked: magic, version, dtype code, the `.idx` size equals the header plus the
arrays (with or without modes), lengths >= 1, document indices start at 0, never decrease and
end at S. Ranges inside `.bin` are checked by the index.

Raises: `DataError` naming the `.idx` file and the field.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.storage import read_exact

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
CODES = {name: code for code, name in DTYPES.items()}


def paths(location: str) -> tuple[str, str]:
    """(`.bin`, `.idx`) locations for a prefix or either file."""
    prefix = location[:-4] if location.endswith((".bin", ".idx")) else location
    return prefix + ".bin", prefix + ".idx"


def _header(f: BinaryIO, location: str, size: int) -> tuple[str, int, int]:
    magic, version, code, seqs, docs = HEADER.unpack(read_exact(f, HEADER.size, location, "the header"))
    if magic != MAGIC:
        raise DataError(f"{location}: magic: expected {MAGIC!r}, got {magic!r}")
    if version != 1:
        raise DataError(f"{location}: version: expected 1, got {version}")
    if code not in DTYPES:
        raise DataError(f"{location}: dtype code: {code} is not one of {sorted(DTYPES)}")
    plain = HEADER.size + seqs * 12 + docs * 8
    if size not in (plain, plain + seqs):
        raise DataError(f"{location}: size {size} bytes, but {seqs} sequences and {docs} document indices need "
                        f"{plain} (or {plain + seqs} with modes)")  # fmt: skip
    return DTYPES[code], seqs, docs


def scan_idx(f: BinaryIO, location: str, size: int) -> tuple[str, np.ndarray, np.ndarray]:
    """(dtype name, byte offsets, byte lengths) of the sequences that `.idx` file `f` describes."""
    dtype, seqs, docs = _header(f, location, size)
    lengths = np.frombuffer(read_exact(f, 4 * seqs, location, "sequence_lengths"), "<i4").astype(np.int64)
    pointers = np.frombuffer(read_exact(f, 8 * seqs, location, "sequence_pointers"), "<i8").astype(np.int64)
    documents = np.frombuffer(read_exact(f, 8 * docs, location, "document_indices"), "<i8")
    if (lengths < 1).any():
        i = int(np.argmax(lengths < 1))
        raise DataError(f"{location}: sequence_lengths[{i}]: {int(lengths[i])} tokens; a sample needs at least 1")
    if docs == 0 or documents[0] != 0 or documents[-1] != seqs or (np.diff(documents) < 0).any():
        raise DataError(f"{location}: document_indices: expected a non-decreasing list from 0 to {seqs}, "
                        f"got {documents[:3].tolist()}...{documents[-3:].tolist()}")  # fmt: skip
    return dtype, pointers, lengths * np.dtype(dtype).itemsize


def encode_idx(lengths: list[int], dtype: str, documents: list[int] | None = None) -> bytes:
    """The `.idx` bytes for sequences of `lengths` tokens stored back to back in `.bin`."""
    itemsize = np.dtype(dtype).itemsize
    docs = list(range(len(lengths) + 1)) if documents is None else documents
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * itemsize if lengths else []
    return (HEADER.pack(MAGIC, 1, CODES[dtype], len(lengths), len(docs)) + np.asarray(lengths, "<i4").tobytes()
            + np.asarray(pointers, "<i8").tobytes() + np.asarray(docs, "<i8").tobytes())  # fmt: skip
