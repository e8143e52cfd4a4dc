"""Byte access to dataset files: local paths, or any fsspec URL when fsspec is installed.

A location containing "://" is a URL and goes through fsspec (imported only then); anything
else is a local path. fsspec is optional: without it a URL raises `DataError`.

A local file is opened only if it is a regular file (`open_regular`): a FIFO would block the
open and a device such as /dev/zero never ends.

Raises: `DataError` naming the location for every missing file, special file, short read or
missing fsspec.
"""

from __future__ import annotations

import os
import posixpath
import stat
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
        return os.fdopen(open_regular(location), "rb")
    except OSError as e:
        raise DataError(f"{location}: cannot open: {getattr(e, 'strerror', None) or e}") from None


def open_regular(location: str) -> int:
    """A read-only descriptor of the local regular file `location`. Raises DataError naming it
    when it is not a regular file (checked on the open descriptor, without blocking); OSError
    when it cannot be opened."""
    fd = os.open(location, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError(f"{location}: cannot open: not a regular file")
    return fd


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
