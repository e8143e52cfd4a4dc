"""OUT's tree before a byte is written: the directory format's paths, their directories, the
temporary that becomes OUT, and its files allocated ahead (`checkpoint.directory` is the format).

`relative_paths(ptc)` names each sub-tensor's file (checked: see `checkpoint.directory`),
`make_tree(ptc, out)` makes their directories, `checkpoint_dir(out)` is the temporary beside
OUT that becomes OUT when complete. `OutDir(dst, out)` is all three plus a
`prealloc.Preallocation` of the `.npy` files: `tenplex reshard` enters it as soon as the dst
PTC is parsed, before numpy and the compiler are imported, so that the helper allocates the
pages on the other core while this process imports, reads the src and compiles. Nothing here
imports numpy.

Invariants:
- OUT is complete or absent, also after a crash (`checkpoint_dir`); an existing OUT is never
  written over;
- an `OutDir` left without `commit()` (an error, a signal) stops its helper, then deletes the
  temporary; `commit()` stops the helper before the tree is made durable and renamed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import atomic_dir, check_relative, write_failure
from tenplex.ir.ptc import PTC
from tenplex.runtime.checkpoint.prealloc import Preallocation, npy_files
from tenplex.runtime.checkpoint.swap import sync_dir, sync_tree

__all__ = ["PTC_FILE", "VALUES_FILE", "CheckpointError", "OutDir", "WriteError", "checkpoint_dir", "make_tree",
           "relative_paths"]  # fmt: skip

PTC_FILE = "ptc.json"
VALUES_FILE = "values.json"


class CheckpointError(TenplexError):
    """A checkpoint directory that cannot be read or written."""


def relative_paths(ptc: PTC) -> dict[str, str]:
    """Sub-tensor id -> file path relative to the directory (see the module docstring).

    Raises CheckpointError naming the partition or sub-tensor whose id or path is unsafe, clashes
    with the values file, or names the same file as another sub-tensor."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}  # file -> what is stored in it, in words
    for part in ptc.partitions:
        check_relative(part.id, "partition id", CheckpointError)
        owner[f"{part.id}/{VALUES_FILE}"] = f"the values of partition {part.id!r}"
        for sid in part.subtensors:
            path = check_relative(ptc.subtensor_map[sid].path, f"sub-tensor {sid!r} path", CheckpointError)
            if path == VALUES_FILE.removesuffix(".json"):
                raise CheckpointError(
                    f"partition {part.id!r}: sub-tensor {sid!r} path {path!r} clashes with {VALUES_FILE}"
                )
            rel = f"{part.id}/{path}.npy"
            if rel in owner:
                raise CheckpointError(f"partition {part.id!r}: {owner[rel]} and sub-tensor {sid!r} share path {rel!r}")
            owner[rel], out[sid] = f"sub-tensor {sid!r}", rel
    _check_no_file_is_a_directory(owner)
    return out


def _check_no_file_is_a_directory(owner: dict[str, str]) -> None:
    dirs = {rel.rsplit("/", k)[0]: rel for rel in owner for k in range(1, rel.count("/") + 1)}
    for rel, who in owner.items():
        if rel in dirs:
            raise CheckpointError(f"{who} names file {rel!r}, which {dirs[rel]!r} needs as a directory")


def make_tree(ptc: PTC, out: Path) -> dict[str, str]:
    """Create `out` and every directory its files need; returns `relative_paths(ptc)`. Raises
    CheckpointError (`relative_paths`), WriteError naming the directory that cannot be made."""
    files = relative_paths(ptc)
    values = [f"{p.id}/{VALUES_FILE}" for p in ptc.partitions if p.values]  # the partitions with a values file
    dirs: set[str] = set()
    for rel in [*files.values(), *values]:
        while (rel := rel.rpartition("/")[0]) and rel not in dirs:  # each directory and those above it, once
            dirs.add(rel)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(out, e) from None
    for rel in sorted(dirs):  # a directory sorts before those in it (its path is their prefix)
        _mkdir(out, rel)
    return files


def _mkdir(out: Path, rel: str) -> None:
    """Directory `out / rel` made (its parent exists); one that exists is no error. Raises WriteError."""
    path = os.path.join(out, rel)
    try:
        os.mkdir(path)
    except OSError as e:
        if not (isinstance(e, FileExistsError) and os.path.isdir(path)):
            raise WriteError(out / rel, e) from None


class WriteError(CheckpointError):
    """An I/O error while writing `path`; `write_checkpoint_dir` names it as the file of OUT."""

    def __init__(self, path: Path, err: OSError):
        super().__init__(str(write_failure(path, err, CheckpointError)))
        self.path, self.err = path, err

    def __reduce__(self) -> tuple:  # a worker process sends it to the writer (`checkpoint.workers`)
        return WriteError, (self.path, self.err)


@contextlib.contextmanager
def checkpoint_dir(out: Path) -> Iterator[Path]:
    """A new temporary directory beside `out` to write into; when the block succeeds it is made
    durable and renamed to `out` (the rename made durable too), when it fails it is deleted:
    `out` is complete or absent, also after a crash (`swap.sync_tree`). A WriteError in the
    block is raised as the CheckpointError naming the file of `out` (and its errno)."""
    with atomic_dir(out, CheckpointError) as tmp:
        try:
            yield tmp
            try:
                sync_tree(tmp)
            except OSError as e:
                raise WriteError(tmp, e) from None
        except WriteError as e:
            shown = out / e.path.relative_to(tmp) if e.path.is_relative_to(tmp) else e.path
            raise write_failure(shown, e.err, CheckpointError) from None
    try:
        sync_dir(out.parent)
    except OSError as e:
        raise write_failure(out.parent, e, CheckpointError) from None


class OutDir:
    """OUT being written (see the module docstring): `with OutDir(dst, out) as o:` makes the
    temporary `o.tmp` and its directories (`o.tree`: `relative_paths(dst)`) and starts `o.pre`
    allocating the `.npy` files; `o.commit()` stops the helper and makes `o.tmp` durable as
    `out`; leaving the block without it stops the helper and deletes `o.tmp`, the exception
    raised as `checkpoint_dir` raises it (a WriteError as the CheckpointError naming OUT's file).

    Raises CheckpointError (OUT exists, unsafe dst paths: `relative_paths`), WriteError."""

    def __init__(self, dst: PTC, out: str | os.PathLike):
        self.dst, self.out, self.started_at = dst, Path(out), time.monotonic()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> OutDir:
        with contextlib.ExitStack() as stack:  # a failure while starting unwinds what was started
            self.tmp: Path = stack.enter_context(checkpoint_dir(self.out))
            self.tree = make_tree(self.dst, self.tmp)
            self.pre = Preallocation(self.tmp, npy_files(self.dst, self.tree))  # stops its helper itself if a signal ends its start
            stack.callback(self.pre.stop)
            self._stack = stack.pop_all()
        return self

    def commit(self) -> None:
        """Stop the helper, then make the tree durable and rename it to OUT (`checkpoint_dir`)."""
        self._stack.close()

    def __exit__(self, *exc: Any) -> bool:
        return self._stack.__exit__(*exc)
