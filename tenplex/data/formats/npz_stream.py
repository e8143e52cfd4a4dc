"""Sample boundaries in a file of concatenated `.npz` archives (the reference Tenplex's format).

Each sample is one complete zip archive as `np.savez` writes it. The file is parsed record by
record: local file headers (with their data skipped by the compressed size, zip64 extras
honoured), the central directory, the optional zip64 end records and the end-of-central-directory
record, whose end is the sample's end. Nothing is guessed from byte patterns inside data.

Invariants checked per archive (offsets relative to the archive's first byte, as in a
stand-alone .npz):
- records come in zip order: local headers, central directory entries, [zip64 end, locator], end;
- the end record's entry count and central-directory offset and size match what was parsed;
- every central-directory entry points at a local header that was parsed;
- no local header uses a data descriptor (bit 3), whose size would not be known up front.

Raises: `DataError` naming the file, the archive number and its byte offset.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from tenplex.data.errors import DataError

LOCAL, CENTRAL, END = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
ZIP64_END, ZIP64_LOCATOR = b"PK\x06\x06", b"PK\x06\x07"
_U32 = 0xFFFFFFFF


class _Archive:
    """Parse state of one archive that starts at `start` in the file."""

    def __init__(self, f: BinaryIO, location: str, number: int, start: int, size: int):
        self.f, self.location, self.number, self.start, self.size = f, location, number, start, size
        self.locals: list[int] = []
        self.central: list[int] = []

    def fail(self, msg: str) -> DataError:
        return DataError(f"{self.location}: archive {self.number} at offset {self.start}: {msg}")

    def read(self, n: int, what: str) -> bytes:
        pos = self.f.tell()
        data = self.f.read(n)
        if len(data) != n:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {pos}, only {len(data)} left")
        return data

    def local_header(self) -> None:
        pos = self.f.tell() - 4
        _, flags, _, _, _, _, csize, _, nlen, xlen = struct.unpack("<HHHHHIIIHH", self.read(26, "a local file header"))
        if flags & 0x08:
            raise self.fail(f"entry at {pos - self.start} uses a data descriptor (sizes unknown up front)")
        self.read(nlen, "an entry name")
        extra = self.read(xlen, "an extra field")
        if csize == _U32:
            csize = _zip64_size(extra, self)
        self.f.seek(csize, 1)
        if self.f.tell() > self.size:
            raise self.fail(f"truncated: entry at {pos - self.start} has {csize} data bytes past the end of the file")
        self.locals.append(pos - self.start)

    def central_entry(self) -> None:
        fields = struct.unpack("<HHHHHHIIIHHHHHII", self.read(42, "a central directory entry"))
        nlen, xlen, clen, offset = fields[9], fields[10], fields[11], fields[15]
        extra = self.read(nlen + xlen + clen, "a central directory entry's name and extra")[nlen : nlen + xlen]
        if offset == _U32:
            offset = _zip64_offset(extra, fields, self)
        self.central.append(offset)

    def end(self, cd_start: int, cd_stop: int, zip64: tuple[int, int, int] | None) -> int:
        _, _, _, entries, cd_size, cd_offset, clen = struct.unpack("<HHHHIIH", self.read(18, "the end record"))
        self.read(clen, "the archive comment")
        if zip64 is not None:
            entries, cd_size, cd_offset = zip64
        found = (len(self.central), cd_stop - cd_start, cd_start - self.start)
        if (entries, cd_size, cd_offset) != found:
            raise self.fail(f"end record says (entries, directory size, directory offset) = {(entries, cd_size, cd_offset)}, "
                            f"parsed {found} (not a concatenation of whole .npz archives?)")  # fmt: skip
        if sorted(self.central) != self.locals:
            raise self.fail(f"central directory points at {sorted(self.central)}, local headers are at {self.locals}")
        return self.f.tell()


def _zip64_size(extra: bytes, archive: _Archive) -> int:
    """The compressed size from a local header's zip64 extra (uncompressed size, then compressed)."""
    for tag, body in _extras(extra):
        if tag == 1 and len(body) >= 16:
            return struct.unpack_from("<Q", body, 8)[0]
    raise archive.fail("a local header has size 0xFFFFFFFF but no zip64 extra field with the sizes")


def _zip64_offset(extra: bytes, fields: tuple[int, ...], archive: _Archive) -> int:
    """The local-header offset from a central entry's zip64 extra (after any 0xFFFFFFFF sizes)."""
    skip = 8 * ((fields[8] == _U32) + (fields[7] == _U32))
    for tag, body in _extras(extra):
        if tag == 1 and len(body) >= skip + 8:
            return struct.unpack_from("<Q", body, skip)[0]
    raise archive.fail("a central entry has offset 0xFFFFFFFF but no zip64 extra field with it")


def _extras(extra: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        out.append((tag, extra[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return out


def _archive(f: BinaryIO, location: str, number: int, start: int, size: int) -> int:
    """Parse the archive at `start`; return where it ends."""
    a = _Archive(f, location, number, start, size)
    sig = a.read(4, "a record signature")
    while sig == LOCAL:
        a.local_header()
        sig = a.read(4, "a record signature")
    cd_start = f.tell() - 4
    while sig == CENTRAL:
        a.central_entry()
        sig = a.read(4, "a record signature")
    cd_stop, zip64 = f.tell() - 4, None
    if sig == ZIP64_END:
        (rest,) = struct.unpack("<Q", a.read(8, "the zip64 end record"))
        body = a.read(rest, "the zip64 end record")
        if len(body) < 44:
            raise a.fail(f"the zip64 end record has {len(body)} bytes, fewer than 44")
        zip64 = struct.unpack_from("<QQQ", body, 20)  # total entries, directory size, directory offset
        if a.read(4, "a record signature") != ZIP64_LOCATOR:
            raise a.fail("the zip64 end record is not followed by a zip64 locator")
        a.read(16, "the zip64 locator")
        sig = a.read(4, "a record signature")
    if sig != END:
        raise a.fail(f"expected a zip record signature at offset {f.tell() - 4}, found {sig!r}")
    return a.end(cd_start, cd_stop, zip64)


def scan_npz_stream(f: BinaryIO, location: str, size: int) -> tuple[list[int], list[int]]:
    """(offsets, lengths) of the archives that make up the file `f` of `size` bytes."""
    offsets, lengths, pos = [], [], 0
    while pos < size:
        f.seek(pos)
        stop = _archive(f, location, len(offsets), pos, size)
        offsets.append(pos)
        lengths.append(stop - pos)
        pos = stop
    if not offsets:
        raise DataError(f"{location}: empty file: no .npz archive in it")
    return offsets, lengths
