"""One data-parallel rank's upcoming samples as a read-only FUSE directory, switched atomically.

`mount(index, state, world, rank, DIR)` mounts a `ViewFS` (`dataset.ops`: the layout, the reads
and what a switch guarantees) and yields a `FuseView` whose `switch(state, world, rank)`
publishes the view of another committed state, W or rank, and retargets the prefetcher.
`read_view(DIR)` reads one whole consistent view with the generation seqlock. Reading the mount
from the process that serves it works with plain Python I/O; numpy's C-level I/O there
deadlocks on the GIL, so readers belong in other processes.

Servers: a process that may mount(2) (root) serves the view with `fuse.session`, the kernel's
protocol without libfuse (`lowlevel=None`; `False` asks for libfuse, `True` refuses to fall
back): a READ's bytes are spliced from the source files' page cache into `/dev/fuse`, files
opened with direct I/O still map shared, and the source files (`DIR/sources/`) are passed
through (FUSE passthrough, Linux >= 6.9): the kernel reads them itself and no READ of them
reaches this process. Otherwise libfuse (mfusepy) serves it, in one thread by default
(`threads=False`): each request is a Python call, and handing the GIL between libfuse's worker
threads costs more than it overlaps. Either way a sample file costs three requests (OPEN, READ,
RELEASE: listings carry the attributes, so no LOOKUP) and its bytes are spliced from the source
file's page cache (`fuse.splice`); a step file (a step's samples in one file) costs the same
three, with one READ per MiB. The mount's read-ahead is raised (`fuse.mount.READ_AHEAD_KB`).

Invariants: `mount` yields a live mount and unmounts it (and stops nothing else) when the block ends.

Raises: `DataError` (bad state, W or rank: nothing changes), `FuseUnavailable` (cannot mount).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenplex.data.errors import DataError
from tenplex.data.index import DatasetIndex
from tenplex.data.prefetch.prefetcher import Prefetcher
from tenplex.data.rank_files import STATE_FILE, RankFiles
from tenplex.data.reader import SampleReader
from tenplex.data.state import DataState
from tenplex.runtime.fuse import mount as fusemount
from tenplex.runtime.fuse.dataset.ops import DIRECT_IO_FROM, ViewFS
from tenplex.runtime.fuse.mount import READ_AHEAD_KB, FuseUnavailable, fuse_unavailable_reason, is_mounted, unmount
from tenplex.runtime.fuse.session import SessionUnavailable, mount_session

__all__ = [
    "DIRECT_IO_FROM", "READ_AHEAD_KB", "FuseUnavailable", "FuseView", "fuse_unavailable_reason", "is_mounted", "mount",
    "mount_ops", "read_view", "serve", "unmount",
]  # fmt: skip

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"step-\d{6,}")  # a step's directory (not its step file)


def serve(ops: Any, directory: str, threads: bool = False) -> None:
    """Mount `ops` read-only at `directory` in the calling thread; return once it is unmounted."""
    options = {"fsname": "tenplex-data", "ro": True, "attr_timeout": 1.0}
    options |= {"max_idle_threads": 10} if threads else {"nothreads": True}
    fusemount.serve(ops, directory, **options)


@contextlib.contextmanager
def mount_ops(ops: Any, directory: str, timeout: float = 10.0, read_ahead_kb: int | None = READ_AHEAD_KB,
          threads: bool = False) -> Iterator[str]:  # fmt: skip
    """Mount `ops` at `directory` in a background thread; yield the resolved path."""
    with fusemount.mount(lambda path: serve(ops, path, threads), directory, timeout=timeout,
                         read_ahead_kb=read_ahead_kb, what="dataset view") as path:  # fmt: skip
        yield path


class FuseView:
    """A mounted view (`mount` yields it): the directory, the current files, and `switch`."""

    def __init__(self, ops: ViewFS, directory: str, steps: int | None, uneven: bool, session: Any = None) -> None:
        self.ops, self.directory, self.steps, self.uneven = ops, directory, steps, uneven
        self._session = session
        self._switching = threading.Lock()

    @property
    def passthrough(self) -> bool:
        """Whether the kernel reads the source files (`DIR/sources/`) itself (module doc); known
        once the kernel has sent its first request (any access to the directory)."""
        return self._session is not None and self._session.passthrough

    @property
    def files(self) -> RankFiles:
        return self.ops.files

    def switch(self, state: DataState, world: int, rank: int, steps: int | None = None) -> RankFiles:
        """Publish the view of rank `rank` of `world` from `state`'s next step, for `steps` steps
        (default: as mounted), and retarget the prefetcher. Raises DataError (nothing changes)."""
        with self._switching:
            old = self.ops.files
            steps = self.steps if steps is None else steps
            files = RankFiles.build(old.index, state, world, rank, steps, self.uneven, old.generation + 1)
            if self.ops.prefetcher is not None:
                self.ops.prefetcher.start(files.view, files.stop)
            self.ops.publish(files)
            return files


@contextlib.contextmanager
def mount(index: DatasetIndex, state: DataState, world: int, rank: int, directory: str | os.PathLike, *,
          steps: int | None = None, uneven: bool = False, reader: SampleReader | None = None,
          prefetcher: Prefetcher | None = None, timeout: float = 10.0,
          read_ahead_kb: int | None = READ_AHEAD_KB, threads: bool = False,
          direct_io_from: int | None = DIRECT_IO_FROM, lowlevel: bool | None = None) -> Iterator[FuseView]:  # fmt: skip
    """Mount rank `rank` of `world`'s view of `steps` steps from `state` (None: to the end of
    the epoch) at `directory`; yield the `FuseView`. `reader` (default: the index's files)
    serves reads unless a `prefetcher` is given; `threads` serves libfuse's requests in several
    threads (module doc; with one thread, a read waiting for its prefetch holds up the others;
    the kernel-protocol server always reads requests in two); sample
    files of at least `direct_io_from` bytes bypass the page cache (`dataset.ops`; None: none,
    for readers that mmap them shared under libfuse); `lowlevel` chooses the server (module doc).
    Raises DataError, FuseUnavailable."""
    files = RankFiles.build(index, state, world, rank, steps, uneven)
    reader = reader or (prefetcher.reader if prefetcher is not None else SampleReader(index, decode=False))
    ops = ViewFS(files, reader, prefetcher, direct_io_from)
    if prefetcher is not None:
        prefetcher.start(files.view, files.stop)
    if lowlevel is not False and (lowlevel or os.geteuid() == 0):
        try:
            with mount_session(ops, os.fspath(directory), read_ahead_kb=read_ahead_kb, what="dataset view",
                               fsname="tenplex-data") as session:  # fmt: skip
                yield FuseView(ops, session.directory, steps, uneven, session)
            return
        except SessionUnavailable as e:
            if lowlevel:
                raise FuseUnavailable(f"cannot mount the dataset view at {directory}: {e}") from None
            log.info("serving %s with libfuse: %s", directory, e)
    with mount_ops(ops, os.fspath(directory), timeout, read_ahead_kb, threads) as live:
        yield FuseView(ops, live, steps, uneven)


def read_view(directory: str | os.PathLike, attempts: int = 100) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(`.state.json`, {"step-SSSSSS/NAME": bytes}) of the sample files of one whole view of a mount at `directory`,
    read with the generation seqlock (module doc), retrying while switches race it.
    Raises DataError after `attempts` tries that each saw a switch."""
    root = Path(directory)
    for _ in range(attempts):
        try:
            before = json.loads((root / STATE_FILE).read_bytes())
            files = {f"{d}/{name}": (root / d / name).read_bytes()
                     for d in sorted(os.listdir(root)) if _STEP_DIR.fullmatch(d) for name in sorted(os.listdir(root / d))}  # fmt: skip
            after = json.loads((root / STATE_FILE).read_bytes())
        except (FileNotFoundError, ValueError):
            continue  # a switch removed what the listing named, or cut a state read short
        if before["generation"] == after["generation"]:
            return before, files
    raise DataError(f"{directory}: no consistent view in {attempts} reads (switches keep racing them)")
