"""Reading and decoding samples by (file, offset, length) from an index.

`SampleReader(index)` reads sample i's bytes from `index.location(file_id)` (a local path inside
the index root, `DatasetIndex.local_path`, or, with fsspec installed, a URL) and decodes them by the index's sample format:
- "numpy": `.npy` bytes -> `np.ndarray`; `.npz` bytes -> dict of name -> `np.ndarray`
  (never unpickles);
- "megatron": a 1-D `np.ndarray` of the index's token dtype;
- "tfrecord": the record's data bytes, after checking the framing and data CRC;
- "raw": the bytes themselves.
Open files are cached per process and dropped when the reader is pickled (DataLoader workers).
`read` and `read_into` may be called from several threads at once (the FUSE view, a prefetcher).

Raises: `DataError` naming the sample and file for a short read or undecodable bytes.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.formats.tfrecord import decode_record
from tenplex.data.index import DatasetIndex
from tenplex.data.storage import filesystem, is_url, open_regular


class SampleReader:
    """Bytes and decoded values of the samples of `index` (files found under `root` or index.root)."""

    def __init__(self, index: DatasetIndex, root: str | None = None, decode: bool = True):
        self.index = index if root is None else index.with_root(root)
        self.decode_samples = decode
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_handles", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _handles={}, _lock=threading.Lock())

    def __len__(self) -> int:
        return len(self.index)

    def _handle(self, file_id: int) -> Any:
        handle = self._handles.get(file_id)
        if handle is None:
            with self._lock:  # one open per file, also when threads race to it
                handle = self._open(file_id)
        return handle

    def _open(self, file_id: int) -> Any:
        if file_id not in self._handles:
            location = self.index.location(file_id)
            if is_url(location):
                self._handles[file_id] = filesystem(location)
            else:
                location = self.index.local_path(file_id)  # never a file outside the root
                try:
                    self._handles[file_id] = open_regular(location)
                except OSError as e:
                    raise DataError(f"{location}: cannot open: {e.strerror}") from None
        return self._handles[file_id]

    def read(self, sample_id: int) -> bytes:
        """The bytes of sample `sample_id`: file[offset : offset + length]."""
        file_id, offset, length = self.index.sample(int(sample_id))
        handle = self._handle(file_id)
        if isinstance(handle, int):
            data = os.pread(handle, length, offset)
        else:
            fs, path = handle
            data = fs.cat_file(path, start=offset, end=offset + length)
        if len(data) != length:
            raise DataError(f"sample {sample_id} of {self.index.location(file_id)}: read {len(data)} of {length} bytes "
                            f"at offset {offset} (file changed or truncated?)")  # fmt: skip
        return data

    def read_into(self, sample_id: int, buffer: memoryview, start: int = 0) -> int:
        """Copy bytes [start, start + len(buffer)) of sample `sample_id` (clipped to the sample)
        into `buffer`; the byte count. A local file is read with one `os.preadv` straight into
        `buffer` (no intermediate bytes object)."""
        file_id, offset, length = self.index.sample(int(sample_id))
        count = max(0, min(len(buffer), length - start))
        if count == 0:
            return 0
        handle = self._handle(file_id)
        if isinstance(handle, int):
            got = os.preadv(handle, [buffer[:count]], offset + start)
        else:
            fs, path = handle
            data = fs.cat_file(path, start=offset + start, end=offset + start + count)
            got = len(data)
            buffer[:got] = data
        if got != count:
            raise DataError(f"sample {sample_id} of {self.index.location(file_id)}: read {got} of {count} bytes "
                            f"at offset {offset + start} (file changed or truncated?)")  # fmt: skip
        return got

    def read_many_into(self, ids: list[int], buffer: memoryview) -> int:
        """Copy the bytes of samples `ids`, back to back, into `buffer` (which must hold them all);
        the byte count. One `os.preadv` per sample of a local file, with the ranges looked up at once."""
        file_ids, offsets, lengths = (a.tolist() for a in self.index.ranges(ids))
        at = 0
        for sample_id, file_id, offset, length in zip(ids, file_ids, offsets, lengths):
            handle = self._handle(file_id)
            if not isinstance(handle, int):
                at += self.read_into(sample_id, buffer[at : at + length])
                continue
            if (got := os.preadv(handle, [buffer[at : at + length]], offset)) != length:
                raise DataError(f"sample {sample_id} of {self.index.location(file_id)}: read {got} of {length} "
                                f"bytes at offset {offset} (file changed or truncated?)")  # fmt: skip
            at += length
        return at

    def file_range(self, sample_id: int, start: int = 0, size: int | None = None) -> tuple[int, int, int] | None:
        """(fd, offset, count) of bytes [start, start + size) of sample `sample_id` (clipped to the
        sample) in its open local file, for a caller that moves them itself (`splice`); None
        for a file behind a URL. The fd stays open as long as the reader."""
        file_id, offset, length = self.index.sample(int(sample_id))
        handle = self._handle(file_id)
        if not isinstance(handle, int):
            return None
        count = max(0, length - start) if size is None else max(0, min(size, length - start))
        return handle, offset + start, count

    def source_fd(self, file_id: int) -> int | None:
        """The open descriptor of local file `file_id` (None: behind a URL); open as long as the reader."""
        handle = self._handle(file_id)
        return handle if isinstance(handle, int) else None

    def read_source(self, file_id: int, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of file `file_id`, cut at its end."""
        handle = self._handle(file_id)
        if isinstance(handle, int):
            return os.pread(handle, size, offset)
        fs, path = handle
        return fs.cat_file(path, start=offset, end=min(offset + size, self.index.files[file_id].size))

    def decode(self, sample_id: int, data: bytes) -> Any:
        """`data` (sample `sample_id`'s bytes) as the index's sample format decodes it."""
        fmt = self.index.sample_format
        where = f"sample {sample_id} of {self.index.location(int(self.index.file_id[sample_id]))}"
        if fmt == "numpy":
            return decode_numpy(data, where)
        if fmt == "megatron":
            return np.frombuffer(data, dtype=self.index.dtype)
        if fmt == "tfrecord":
            return decode_record(data, where)
        return data

    def __getitem__(self, sample_id: int) -> Any:
        data = self.read(sample_id)
        return self.decode(int(sample_id), data) if self.decode_samples else data

    def close(self) -> None:
        for handle in getattr(self, "_handles", {}).values():
            if isinstance(handle, int):
                os.close(handle)
        getattr(self, "_handles", {}).clear()

    def __del__(self) -> None:
        self.close()


def decode_numpy(data: bytes, where: str = "sample") -> np.ndarray | dict[str, np.ndarray]:
    """An `.npy` array or an `.npz` dict of arrays from their bytes (no pickles)."""
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return {name: loaded[name] for name in loaded.files}
        return loaded
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{where}: cannot decode as .npy/.npz: {e}") from None
