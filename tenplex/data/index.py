"""The dataset index: where the bytes of every sample are.

A `DatasetIndex` has a file table (`FileEntry`: a name relative to `root`, and a size) and, for
each sample id i in 0..N-1, three int64 numbers: sample i is bytes `[offset[i], offset[i] +
length[i])` of file `files[file_id[i]]`. Sample ids are positions in (file order, record order).
`sample_format` says how a sample's bytes decode (see `tenplex.data.reader`).

Invariants:
- `sample_format` is one of SAMPLE_FORMATS; `dtype` is a numpy dtype name for "megatron" and
  None for every other format;
- file names are unique, non-empty and relative ("/"-separated), with no ".." component; sizes
  are >= 0;
- a file is read only inside the root (`local_path`): an entry that resolves outside it (through
  a symlink) raises DataError naming the index (`source`: the file it was loaded from) and the
  entry;
- `file_id`, `offset` and `length` are read-only 1-D int64 arrays of one length N;
- every range lies in its file: 0 <= file_id < F and 0 <= offset < offset + length <= size.

The fingerprint is the sha256 (hex) of the canonical header (sample format, dtype, N, file names
and sizes) followed by the three arrays as little-endian int64. `root` is not part of it, so a
dataset keeps its fingerprint when it moves. Saved as `.npz` (`tenplex.data-index/1`: a JSON
header plus the three arrays), written atomically; loading re-checks every invariant and the
stored fingerprint; a truncated, corrupt or special file (FIFO, device) is one DataError naming
it (`npz_file`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.npz_file import NpzError, read_npz
from tenplex.data.storage import is_url, join, size_of
from tenplex.ir.files import write_atomic

INDEX_FORMAT = "tenplex.data-index/1"
SAMPLE_FORMATS = ("numpy", "megatron", "tfrecord", "raw")
_ARRAYS = ("file_id", "offset", "length")
MEGATRON_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16")


@attrs.frozen
class FileEntry:
    """One data file: `name` relative to the index root, and its size in bytes."""

    name: str
    size: int

    def __attrs_post_init__(self) -> None:
        if (not isinstance(self.name, str) or not self.name or self.name.startswith("/") or "\\" in self.name
                or ".." in self.name.split("/") or "\0" in self.name):  # fmt: skip
            raise DataError(f"file name {self.name!r} is not a non-empty relative '/'-separated path without '..'")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise DataError(f"file {self.name}: size {self.size!r} is not an integer >= 0")


def _int64(values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"index arrays hold integers, got dtype {array.dtype}")
    out = np.array(array, dtype=np.int64, copy=True)
    out.setflags(write=False)
    return out


@attrs.frozen(eq=False)
class DatasetIndex:
    """Per-sample (file, offset, length) over a file table. Equal when fingerprint and root are."""

    sample_format: str
    files: tuple[FileEntry, ...] = attrs.field(converter=tuple)
    file_id: np.ndarray = attrs.field(converter=_int64, repr=False)
    offset: np.ndarray = attrs.field(converter=_int64, repr=False)
    length: np.ndarray = attrs.field(converter=_int64, repr=False)
    root: str = ""
    dtype: str | None = None
    source: str = ""  # the file it was loaded from, for messages; not part of the fingerprint
    fingerprint: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._verify()
        object.__setattr__(self, "fingerprint", hashlib.sha256(self.canonical_bytes()).hexdigest())

    def _verify(self) -> None:
        if not isinstance(self.root, str) or "\0" in self.root:
            raise DataError(f"root {self.root!r} is not a path or URL")
        if self.sample_format not in SAMPLE_FORMATS:
            raise DataError(f"sample_format {self.sample_format!r} is not one of {list(SAMPLE_FORMATS)}")
        if (self.sample_format == "megatron") != (self.dtype is not None):
            raise DataError(
                f"dtype {self.dtype!r} given for sample_format {self.sample_format!r} (only megatron has one)"
            )
        if self.dtype is not None and self.dtype not in MEGATRON_DTYPES:
            raise DataError(f"dtype {self.dtype!r} is not one of {list(MEGATRON_DTYPES)}")
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            raise DataError(f"file {next(n for n in names if names.count(n) > 1)!r} appears twice in the file table")
        for name in _ARRAYS:
            if getattr(self, name).ndim != 1:
                raise DataError(f"{name}: expected a 1-D array, got shape {getattr(self, name).shape}")
        if not len(self.file_id) == len(self.offset) == len(self.length):
            raise DataError(
                f"file_id, offset and length have lengths {len(self.file_id)}, {len(self.offset)}, {len(self.length)}"
            )
        check_ranges(self.files, self.file_id, self.offset, self.length)

    def __len__(self) -> int:
        return len(self.file_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetIndex) and (self.fingerprint, self.root) == (other.fingerprint, other.root)

    def __hash__(self) -> int:
        return hash((self.fingerprint, self.root))

    @classmethod
    def from_files(cls, sample_format: str, root: str, parts: Iterable[tuple[str, int, Sequence[int], Sequence[int]]],
                   dtype: str | None = None) -> DatasetIndex:  # fmt: skip
        """From (name, size, offsets, lengths) per file, in sample-id order."""
        files, ids, offsets, lengths = [], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for k, (name, size, offs, lens) in enumerate(parts):
            files.append(FileEntry(name, size))
            offsets.append(np.asarray(offs, dtype=np.int64))
            lengths.append(np.asarray(lens, dtype=np.int64))
            ids.append(np.full(len(offsets[-1]), k, dtype=np.int64))
        return cls(sample_format, tuple(files), *map(np.concatenate, (ids, offsets, lengths)), root, dtype)

    def header(self) -> dict[str, Any]:
        """The canonical JSON header that the fingerprint covers (root excluded)."""
        return {
            "index": INDEX_FORMAT, "sample_format": self.sample_format, "dtype": self.dtype,
            "samples": len(self), "files": [[f.name, f.size] for f in self.files],
        }  # fmt: skip

    def canonical_bytes(self) -> bytes:
        head = json.dumps(self.header(), sort_keys=True, separators=(",", ":")).encode()
        body = b"".join(getattr(self, a).astype("<i8").tobytes() for a in _ARRAYS)
        return head + b"\n" + body

    def location(self, file_id: int) -> str:
        """Where file `file_id` is: its name under `root` (a path or URL)."""
        return join(self.root, self.files[file_id].name)

    def sample(self, sample_id: int) -> tuple[int, int, int]:
        """(file_id, offset, length) of sample `sample_id`. Raises DataError when out of range."""
        if not 0 <= sample_id < len(self):
            raise DataError(f"sample {sample_id} is not in the index (0..{len(self) - 1})")
        return int(self.file_id[sample_id]), int(self.offset[sample_id]), int(self.length[sample_id])

    def ranges(self, ids: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file_id, offset, length) arrays for sample `ids`, e.g. what a prefetcher must fetch for
        `RankView.ids_between(s, s + k)`. Raises DataError naming the first id outside 0..N-1."""
        ids = np.asarray(ids, dtype=np.int64)
        bad = (ids < 0) | (ids >= len(self))
        if bad.any():
            raise DataError(f"sample {int(ids[np.argmax(bad)])} is not in the index (0..{len(self) - 1})")
        return self.file_id[ids], self.offset[ids], self.length[ids]

    def total_bytes(self) -> int:
        return int(self.length.sum())

    def check_files(self) -> None:
        """Compare the file table with the files at `root`. Raises DataError naming the first file
        that is missing or whose size differs."""
        for k, f in enumerate(self.files):
            actual = size_of(self.location(k))
            if actual != f.size:
                raise DataError(f"{self.location(k)}: size {actual} bytes on disk, but the index records {f.size}")

    def local_path(self, file_id: int) -> str:
        """`location(file_id)`, a local path, after checking that it resolves inside the root
        (symlinks followed). Raises DataError naming the index and the entry when it does not."""
        location = self.location(file_id)
        if self.root and not is_url(self.root):
            real, root = os.path.realpath(location), os.path.realpath(self.root)
            if os.path.commonpath([real, root]) != root:
                raise DataError(f"{self.source or 'dataset index'}: file {self.files[file_id].name!r} resolves to "
                                f"{real}, outside the index root {self.root}")  # fmt: skip
        return location

    def with_root(self, root: str) -> DatasetIndex:
        return attrs.evolve(self, root=root)

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to `path` (`.npz`, complete or absent)."""
        meta = dict(self.header(), root=self.root, fingerprint=self.fingerprint)
        buf = io.BytesIO()
        arrays = {a: getattr(self, a) for a in _ARRAYS}
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        write_atomic(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> DatasetIndex:
        """Read an index written by `save`. Raises DataError naming `path` and the field."""
        try:
            arrays = read_npz(path)
        except NpzError as e:
            raise DataError(f"{path}: cannot read a dataset index: {e}") from None
        return _from_saved(str(path), arrays)


def _from_saved(source: str, arrays: dict[str, np.ndarray]) -> DatasetIndex:
    missing = [k for k in ("meta", *_ARRAYS) if k not in arrays]
    if missing:
        raise DataError(f"{source}: not a dataset index: no array {missing[0]!r}")
    try:
        meta = json.loads(arrays["meta"].tobytes())
    except (ValueError, RecursionError) as e:
        raise DataError(f"{source}: meta: not valid JSON: {e}") from None
    keys = ("index", "sample_format", "dtype", "samples", "files", "root", "fingerprint")
    if not isinstance(meta, dict) or sorted(meta) != sorted(keys):
        raise DataError(
            f"{source}: meta: expected the keys {list(keys)}, got {sorted(meta) if isinstance(meta, dict) else meta!r}"
        )
    if meta["index"] != INDEX_FORMAT:
        raise DataError(f"{source}: index: expected {INDEX_FORMAT!r}, got {meta['index']!r}")
    try:
        files = tuple(FileEntry(name, size) for name, size in meta["files"])
        index = DatasetIndex(meta["sample_format"], files, *(arrays[a] for a in _ARRAYS), meta["root"], meta["dtype"],
                             source)  # fmt: skip
    except (TypeError, ValueError) as e:
        raise DataError(f"{source}: {e}") from None
    if index.fingerprint != meta["fingerprint"] or len(index) != meta["samples"]:
        raise DataError(
            f"{source}: fingerprint: stored {meta['fingerprint']!r}, but the contents hash to {index.fingerprint!r}"
        )
    root = index.root
    if root and not _is_absolute(root):  # absolute: the cwd may change (a FUSE mount) before a read
        index = index.with_root(str(Path(os.path.abspath(source)).parent / root))
    return index


def _is_absolute(root: str) -> bool:
    return "://" in root or Path(root).is_absolute()


def check_ranges(files: Sequence[FileEntry], file_id: np.ndarray, offset: np.ndarray, length: np.ndarray) -> None:
    """Raises DataError naming the file and the first sample whose range leaves its file."""
    n_files = len(files)
    bad = (file_id < 0) | (file_id >= n_files)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"sample {i}: file_id {int(file_id[i])} is not in the file table (0..{n_files - 1})")
    sizes = np.array([f.size for f in files], dtype=np.int64)[file_id] if n_files else np.zeros(0, np.int64)
    bad = (offset < 0) | (length < 1) | (offset > sizes - length)
    if bad.any():
        i = int(np.argmax(bad))
        f, a, n = files[int(file_id[i])], int(offset[i]), int(length[i])
        raise DataError(
            f"sample {i} of {f.name}: range [{a}, {a + n}) is not a non-empty range inside the file's {f.size} bytes"
        )
