"""Byte access to dataset files: local paths, or any fsspec URL when fsspec is installed.

A location containing "://" is a URL and goes through fsspec (imported only then); anything
else is a local path. fsspec is optional: without it a URL raises `DataError`.

Raises: `DataError` naming the location for every missing file, short read or missing fsspec.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any, BinaryIO

from tenplex.data.errors import DataError


def is_url(location: str) -> bool:
    return "://" in location


def join(root: str, name: str) -> str:
    """`name` (relative, "/"-separated) under `root`; `root` "" leaves `name` as it is."""
    if not root:
        return name
    return posixpath.join(root, name) if is_url(root) else str(Path(root) / name)


def filesystem(location: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise DataError(f"{location}: reading URLs needs the optional fsspec package (pip install fsspec)") from None
    return fsspec.core.url_to_fs(location)


def size_of(location: str) -> int:
    """The size in bytes of the file at `location`."""
    try:
        if is_url(location):
            fs, path = filesystem(location)
            return int(fs.size(path))
        return os.stat(location).st_size
    except OSError as e:
        raise DataError(f"{location}: cannot stat: {getattr(e, 'strerror', None) or e}") from None


def open_binary(location: str) -> BinaryIO:
    """A readable, seekable binary file object for `location` (the caller closes it)."""
    try:
        if is_url(location):
            fs, path = filesystem(location)
            return fs.open(path, "rb")
        return open(location, "rb")  # noqa: SIM115 -- returned to the caller, who closes it
    except OSError as e:
        raise DataError(f"{location}: cannot open: {getattr(e, 'strerror', None) or e}") from None


def read_exact(f: BinaryIO, n: int, location: str, what: str) -> bytes:
    """Exactly `n` bytes from `f`. Raises DataError naming `location` and `what` on a short read."""
    start = f.tell()
    data = f.read(n)
    if len(data) != n:
        raise DataError(f"{location}: truncated: {what} needs {n} bytes at offset {start}, only {len(data)} left")
    return data


def list_files(location: str, suffixes: tuple[str, ...]) -> list[str]:
    """Files below directory `location` whose names end in one of `suffixes`, as sorted
    "/"-separated paths relative to `location`."""
    if is_url(location):
        fs, path = filesystem(location)
        base = path.rstrip("/") + "/"
        found = [p[len(base) :] for p in fs.find(path) if p.startswith(base)]
    else:
        root = Path(location)
        found = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    return sorted(p for p in found if p.endswith(suffixes))
