"""Replacing a directory atomically: a complete new tree appears at a path, or nothing changes.

`swap_in(tmp, path)` exchanges the two paths with `renameat2(RENAME_EXCHANGE)` where Linux has it,
else with two renames that a crash can interrupt only with the old tree kept beside `path`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["remove", "swap_in", "write_fsynced"]


def write_fsynced(file: Path, data: bytes) -> None:
    with open(file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def swap_in(tmp: Path, path: Path) -> None:
    """Make `tmp` appear at `path`; on return a replaced old tree (if any) is at `tmp`."""
    if not os.path.lexists(path):
        os.replace(tmp, path)
    elif not _exchange(tmp, path):
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, old / "x")  # a crash before the next rename leaves the old tree here
        try:
            os.replace(tmp, path)
        except OSError:
            os.replace(old / "x", path)
            os.rmdir(old)
            raise
        os.replace(old, tmp)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux `renameat2(RENAME_EXCHANGE)`; False if unavailable."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
