"""Replacing a directory atomically: a complete new tree appears at a path, or nothing changes.

`swap_in(tmp, path)` exchanges the two paths with `renameat2(RENAME_EXCHANGE)` where Linux has it,
else with two renames that a crash can interrupt only with the old tree kept beside `path`.

Durability, so that a crash (power loss) too leaves a path complete or absent: a new tree is
made durable before it is renamed into place (`sync_tree`), and the rename after it
(`sync_dir` of the parent). `sync_tree` is one `syncfs(2)` of the tree's file system where
Linux has it: one flush and journal commit for all the files, where an `fsync` per file costs a
commit each (it also flushes other writers' dirty data on that file system); elsewhere every
file and directory is fsynced. On tmpfs both are free: nothing there outlives a reboot.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["remove", "swap_in", "sync_dir", "sync_tree", "write_fsynced"]


def write_fsynced(file: Path, data: bytes) -> None:
    with open(file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sync_tree(root: Path) -> None:
    """Make every file and directory under `root` durable (see the module docstring). Raises OSError."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd):
            return
    finally:
        os.close(fd)
    for dirpath, _, names in os.walk(root):
        for name in [*names, "."]:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def sync_dir(path: Path) -> None:
    """Make the entries of directory `path` durable (a rename into it). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(fd: int) -> bool:
    """`syncfs(fd)`; False where the C library has none. Raises OSError when it fails."""
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    if syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return True


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
    sync_dir(path.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux `renameat2(RENAME_EXCHANGE)`; False if unavailable."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
