"""TFRecord files: records of uint64 length, uint32 masked CRC-32C of the length bytes, the
data, and uint32 masked CRC-32C of the data (all little-endian). One sample is one whole record,
`length + 16` bytes, as in the reference Tenplex's index, so a rank's byte stream stays a valid
TFRecord file.

Invariants checked per record: the header is complete, both CRCs match (the data CRC only when
`verify` is true) and the data lies inside the file.

Raises: `DataError` naming the file, the record number and its byte offset.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from tenplex.data.errors import DataError
from tenplex.data.formats.crc32c import masked_crc32c
from tenplex.data.storage import read_exact

SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".tfr")


def encode_record(data: bytes) -> bytes:
    """One framed TFRecord record holding `data`."""
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def decode_record(record: bytes, where: str = "record") -> bytes:
    """The data of one framed record. Raises DataError naming `where` when the framing is wrong."""
    if len(record) < 16 or struct.unpack_from("<Q", record)[0] != len(record) - 16:
        raise DataError(f"{where}: {len(record)} bytes are not one framed TFRecord record")
    data = record[12:-4]
    if struct.unpack_from("<I", record, len(record) - 4)[0] != masked_crc32c(data):
        raise DataError(f"{where}: data CRC mismatch")
    return data


def _record(f: BinaryIO, location: str, number: int, pos: int, size: int, verify: bool) -> int:
    head = read_exact(f, 12, location, f"record {number}'s header")
    length, crc = struct.unpack("<QI", head)
    if crc != masked_crc32c(head[:8]):
        raise DataError(f"{location}: record {number} at offset {pos}: length CRC {crc:#010x} does not match "
                        f"{masked_crc32c(head[:8]):#010x} (not a TFRecord file, or corrupt)")  # fmt: skip
    stop = pos + 16 + length
    if stop > size:
        raise DataError(
            f"{location}: record {number} at offset {pos}: truncated: {length} data bytes end at {stop}, the file has {size}"
        )
    if verify:
        data = read_exact(f, length, location, f"record {number}'s data")
        (dcrc,) = struct.unpack("<I", read_exact(f, 4, location, f"record {number}'s data CRC"))
        if dcrc != masked_crc32c(data):
            raise DataError(
                f"{location}: record {number} at offset {pos}: data CRC {dcrc:#010x} does not match {masked_crc32c(data):#010x}"
            )
    return stop


def scan_tfrecord(f: BinaryIO, location: str, size: int, verify: bool = True) -> tuple[list[int], list[int]]:
    """(offsets, lengths) of the records in TFRecord file `f` of `size` bytes."""
    offsets, lengths, pos = [], [], 0
    while pos < size:
        f.seek(pos)
        stop = _record(f, location, len(offsets), pos, size, verify)
        offsets.append(pos)
        lengths.append(stop - pos)
        pos = stop
    return offsets, lengths
