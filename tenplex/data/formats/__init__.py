"""Index builders: files of one dataset format -> a `DatasetIndex`.

    numpy     a directory (searched recursively) or files of `.npy` (one sample each) and `.npz`
              (one or more concatenated archives, one sample each); sample format "numpy"
    megatron  Megatron-LM `.bin`/`.idx` pairs (given as prefix, `.bin` or `.idx`); one sample
              per sequence; sample format "megatron" with the token dtype
    tfrecord  TFRecord files; one sample per framed record; sample format "tfrecord"

Files are ordered as given, a directory's files by their sorted relative paths. The index root
is the deepest directory containing every PATH argument (a directory argument counts itself);
file names are relative to it, so the fingerprint does not depend on where the dataset lies.

Raises: `DataError` naming the file (and record or field) for every malformed input.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from tenplex.data.errors import DataError
from tenplex.data.formats import megatron, numpy_files, tfrecord
from tenplex.data.index import DatasetIndex
from tenplex.data.storage import filesystem, is_url, list_files, open_binary, size_of

FORMATS = ("numpy", "megatron", "tfrecord")
_BY_SUFFIX = {".npy": "numpy", ".npz": "numpy", ".bin": "megatron", ".idx": "megatron"}
_BY_SUFFIX.update(dict.fromkeys(tfrecord.SUFFIXES, "tfrecord"))


def _is_dir(location: str) -> bool:
    if is_url(location):
        fs, path = filesystem(location)
        return location.endswith("/") or fs.isdir(path)
    return Path(location).is_dir()


def detect_format(location: str) -> str:
    """The builder for `location`, from its extension; a directory is "numpy", a prefix with
    `.bin` and `.idx` files is "megatron"."""
    if _is_dir(location):
        return "numpy"
    if not is_url(location) and all(Path(p).is_file() for p in megatron.paths(location)):
        return "megatron"
    for suffix, fmt in _BY_SUFFIX.items():
        if location.endswith(suffix):
            return fmt
    raise DataError(f"{location}: cannot tell the dataset format from the extension; give one of {list(FORMATS)}")


def _root(locations: Sequence[str]) -> str:
    bases = [loc.rstrip("/") if _is_dir(loc) else (posixpath.dirname(loc) if is_url(loc) else os.path.dirname(loc))
             for loc in locations]  # fmt: skip
    if any(is_url(b) for b in bases):
        return _common_url(bases) if all(is_url(b) for b in bases) else ""
    return os.path.commonpath([os.path.abspath(b or ".") for b in bases])


def _common_url(bases: Sequence[str]) -> str:
    parts = [b.split("/") for b in bases]
    common = []
    for column in zip(*parts):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    return "/".join(common)


def _relative(location: str, root: str) -> str:
    if is_url(location):
        return location[len(root) :].lstrip("/") if root and location.startswith(root) else location
    return Path(os.path.relpath(os.path.abspath(location), root)).as_posix()


def _expand(location: str, fmt: str) -> list[str]:
    if _is_dir(location):
        if fmt != "numpy":
            raise DataError(f"{location}: a directory is indexed as numpy sample files, not as {fmt}")
        found = list_files(location, numpy_files.SUFFIXES)
        if not found:
            raise DataError(f"{location}: no .npy or .npz files in the directory")
        return [(posixpath.join if is_url(location) else os.path.join)(location, p) for p in found]
    return [megatron.paths(location)[0]] if fmt == "megatron" else [location]


def _scan(fmt: str, location: str, verify: bool) -> tuple[int, Sequence[int], Sequence[int], str | None]:
    """(file size, offsets, lengths, dtype) of the samples in `location`."""
    if fmt == "megatron":
        idx = megatron.paths(location)[1]
        with open_binary(idx) as f:
            dtype, offsets, lengths = megatron.scan_idx(f, idx, size_of(idx))
        return size_of(location), offsets, lengths, dtype
    size = size_of(location)
    with open_binary(location) as f:
        if fmt == "tfrecord":
            return size, *tfrecord.scan_tfrecord(f, location, size, verify), None
        return size, *numpy_files.scan_numpy(f, location, size), None


def build_index(locations: Sequence[str], fmt: str | None = None, verify: bool = True) -> DatasetIndex:
    """The index of the samples in `locations` (paths or fsspec URLs), in the order given.

    `fmt` None detects the format from each extension; all must agree. `verify` False skips the
    TFRecord data CRCs (the framing and length CRCs are always checked).
    """
    if not locations:
        raise DataError("no dataset files given")
    formats = sorted({fmt or detect_format(loc) for loc in locations})
    if len(formats) > 1 or formats[0] not in FORMATS:
        raise DataError(f"dataset files of mixed or unknown formats {formats}; give one of {list(FORMATS)}")
    files = [f for loc in locations for f in _expand(loc, formats[0])]
    root = _root(locations)
    parts, dtypes = [], set()
    for location in files:
        size, offsets, lengths, dtype = _scan(formats[0], location, verify)
        parts.append((_relative(location, root), size, offsets, lengths))
        dtypes.add(dtype)
    if len(dtypes) > 1:
        raise DataError(f"megatron files with different token dtypes {sorted(dtypes)}")
    return DatasetIndex.from_files(formats[0], root, parts, dtypes.pop())
