"""The FUSE operations of a rank's dataset view (`ViewFS`): the current `RankFiles` as files.

Layout (`tenplex.data.rank_files`): `DIR/.state.json`, `DIR/step-SSSSSS/PPP-IIII.EXT` (a file
per sample), `DIR/step-SSSSSS.bin` (a file per step: a table, then the step's samples;
`tenplex.data.step_file`), `DIR/ranges.bin` (where the view's samples lie in the sources;
`tenplex.data.ranges_file`) and `DIR/sources/FFFFFF` (the source files as they are: `backing`
names each, so the kernel-protocol server passes them through and no READ of them comes).

Reads: an open file is a header (a megatron sample's `.npy` header, a step file's table) and
samples one after another. Their bytes come straight from their source byte ranges
(`SampleReader.file_range`, spliced by the mount from the source files' page cache into the
reply, gathered from wherever a step's samples lie: `fuse.splice`), or, with a `Prefetcher`,
from its cache (`Prefetcher.take` on a sample's first read), or, for a source behind a URL,
read by the reader.

Page cache: a sample file of at least `direct_io_from` bytes (`DIRECT_IO_FROM`, 256 KiB) is
opened with direct I/O: the kernel copies each reply once, into the reader's buffer, instead of
into fresh page-cache pages and from there again (half the time of a 1 MiB read here; under
libfuse such a file cannot be mmap'ed shared, MAP_PRIVATE works: libfuse 3.14 cannot ask for
FUSE_DIRECT_IO_ALLOW_MMAP, which `fuse.session` does). A smaller file goes through the page cache, which the kernel keeps
across opens (a sample file's path names the same bytes in every view), and knows its end there
(one READ where direct I/O needs another for EOF). Step files and the ranges file always use
direct I/O: the same name holds another view's table after a switch. Source files keep the page
cache (they never change).

Switch atomicity: the current view is one immutable `RankFiles`, replaced under a lock by
`publish`; every operation reads it once, so each answer comes from one view:
- `opendir` pins the view: listing an open directory shows the view it was opened in;
- an open file keeps serving the bytes it named when it was opened;
- after a switch, a name that the new view does not have is ENOENT (the old view's unread
  files are not served);
- `.state.json` (read without the page cache; read it to EOF, its size may be a second stale)
  names the view's `generation`, which every switch increments (the seqlock of `mount.read_view`).

Invariants: the view is read-only; generations of published views strictly increase.
"""
from __future__ import annotations

import bisect
import errno
import itertools
import os
import stat
import threading
import time
from typing import Any

from tenplex.data.errors import DataError
from tenplex.data.prefetch.prefetcher import Prefetcher
from tenplex.data.ranges_file import SOURCES, source_name
from tenplex.data.rank_files import RANGES_FILE, STATE_FILE, STEP_SUFFIX, RankFiles
from tenplex.data.reader import SampleReader
from tenplex.runtime.fuse import splice
from tenplex.runtime.fuse.dataset.layout import ZEROS, Layout, Open, source_layout
from tenplex.runtime.fuse.dataset.names import Names

DIRECT_IO_FROM = 256 << 10  # sample files of this size and up bypass the page cache (module doc)


class ViewFS:
    """mfusepy operations showing the current `RankFiles` (module doc). Thread-safe."""

    use_ns = True

    def __init__(self, files: RankFiles, reader: SampleReader, prefetcher: Prefetcher | None = None,
                 direct_io_from: int | None = DIRECT_IO_FROM) -> None:  # fmt: skip
        self.reader, self.prefetcher, self.direct_io_from = reader, prefetcher, direct_io_from
        self._files = files
        self._lock = threading.Lock()
        self._handles: dict[int, Open] = {}
        self._dirs: dict[int, tuple[RankFiles, int | None]] = {}  # fh: (view, step; None: the root, -1: sources/)
        self.names = Names(files, reader)
        self._ids = itertools.count(1)
        now, ids = time.time_ns(), {"st_uid": os.getuid(), "st_gid": os.getgid()}
        self._attrs = {"st_atime": now, "st_mtime": now, "st_ctime": now, **ids, "st_nlink": 1}

    @property
    def files(self) -> RankFiles:
        return self._files

    def publish(self, files: RankFiles) -> None:
        """Make `files` the current view. Raises DataError unless its generation is newer."""
        with self._lock:
            if files.generation <= self._files.generation:
                raise DataError(f"generation: {files.generation} is not after the current {self._files.generation}")
            self.names.reset(files)
            self._files = files

    # -- operations ----------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        """Attributes of `path` in the current view; of the open file `fh` (fstat) in its own."""
        handle = self._handles.get(fh) if fh is not None else None
        if handle is not None:
            return {**self._attrs, "st_mode": stat.S_IFREG | 0o444, "st_size": handle.layout.size}
        files = self._files
        kind, node = self.names.resolve(files, path)
        if kind in ("root", "step", "sources"):
            return {**self._attrs, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
        size = self._size(files, kind, node)
        return {**self._attrs, "st_mode": stat.S_IFREG | 0o444, "st_size": size}

    def _size(self, files: RankFiles, kind: str, node: Any) -> int:
        if kind == "state":
            return len(files.state_bytes())
        if kind == "ranges":
            return len(files.ranges_bytes())
        return files.index.files[node].size if kind == "source" else node.size

    def opendir(self, path: str) -> int:
        files = self._files
        kind, step = self.names.resolve(files, path)
        if kind not in ("root", "step", "sources"):
            raise OSError(errno.ENOTDIR, path)
        step = -1 if kind == "sources" else step
        with self._lock:
            fh = next(self._ids)
            self._dirs[fh] = (files, step)
        return fh

    def readdir(self, path: str, fh: int) -> list[str]:
        files, step = self._dirs[fh]
        return [".", "..", *self.names.entries(files, step)]

    def readdir_plus(self, path: str, fh: int) -> list[tuple[str, dict[str, Any]]]:
        """`readdir` with each entry's attributes (with READDIRPLUS the kernel then needs no LOOKUP
        per file; the mount serves plain listings from it too, so that offsets stay consistent)."""
        files, step = self._dirs[fh]
        directory = {**self._attrs, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
        regular = {**self._attrs, "st_mode": stat.S_IFREG | 0o444}
        if step == -1:  # DIR/sources
            return [(".", directory), ("..", directory),
                    *((source_name(f), {**regular, "st_size": e.size}) for f, e in enumerate(files.index.files))]  # fmt: skip
        if step is None:
            state = {**regular, "st_size": len(files.state_bytes())}
            ranges = {**regular, "st_size": len(files.ranges_bytes())}
            return [(".", directory), ("..", directory), (STATE_FILE, state), (RANGES_FILE, ranges), (SOURCES, directory),
                    *(e for s in files.steps for e in ((files.step_name(s), directory),
                      (files.step_name(s) + STEP_SUFFIX, {**regular, "st_size": files.step_file_size(s)})))]  # fmt: skip
        names = self.names.entries(files, step)
        nodes = [files.sample_file(step, p) for p in range(len(names))]
        self.names.remember(files, path, names, nodes)
        return [(".", directory), ("..", directory), *((n, {**regular, "st_size": f.size}) for n, f in zip(names, nodes))]

    def releasedir(self, path: str, fh: int) -> int:
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise OSError(errno.EROFS, path)
        files = self._files
        kind, node = self.names.resolve(files, path)
        if kind in ("root", "step", "sources"):
            raise OSError(errno.EISDIR, path)
        if kind in ("state", "ranges"):
            handle = Open(Layout(files.state_bytes() if kind == "state" else files.ranges_bytes(), direct=True))
        elif kind == "source":
            handle = Open(source_layout(files.index.files[node].size), node, self._source_fd(node))
        elif kind == "steps":
            handle = Open(node)
        else:
            direct = self.direct_io_from is not None and node.size >= self.direct_io_from
            handle = Open(Layout(node.header, ((node.step, node.position, node.sample_id, node.length),), direct))
        with self._lock:
            fh = next(self._ids)
            self._handles[fh] = handle
        return fh

    def open_flags(self, fh: int) -> tuple[bool, bool]:
        """(direct_io, keep_cache): `.state.json`, step files and sample files of at least
        `direct_io_from` bytes (None: none) bypass the page cache, smaller sample files keep it
        (module doc)."""
        direct = self._handles[fh].layout.direct
        return direct, not direct

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """The bytes that `read_buf` names (the mount splices them itself)."""
        return bytes(splice.gather(self.read_buf(path, size, offset, fh)))

    def read_buf(self, path: str | None, size: int, offset: int, fh: int) -> list[splice.Segment]:
        """Bytes [offset, offset + size) of open file `fh` (cut at its end) as `fuse.splice`
        segments: its header, then the samples' bytes (gathered: a step file's samples lie
        anywhere in their source files) from the prefetcher's cache or their source files."""
        h = self._handles[fh]
        f = h.layout
        end = min(offset + size, f.size)
        if end <= offset:
            return []
        if h.source is not None:  # a source file not passed through (libfuse, or no passthrough here)
            if h.fd is not None:
                return [splice.FileRange(h.fd, offset, end - offset)]
            try:
                return [self.reader.read_source(h.source, offset, end - offset)]
            except (DataError, OSError) as e:
                raise OSError(errno.EIO, f"{SOURCES}/{source_name(h.source)}: {e}") from None
        out: list[splice.Segment] = []
        if offset < len(f.header):
            out.append(memoryview(f.header)[offset:end])
        if (pad := min(end, len(f.header) + f.pad) - max(offset, len(f.header))) > 0:
            out.append(ZEROS[:pad])
        at = max(offset, len(f.header) + f.pad)
        k = max(0, bisect.bisect_right(f.starts, at) - 1)
        try:
            while at < end:
                stop = min(end, f.starts[k] + f.parts[k][3])
                if stop > at:
                    out.append(self._sample(h, k, at - f.starts[k], stop - at))
                at, k = max(at, stop), k + 1
        except DataError as e:
            raise OSError(errno.EIO, str(e)) from None
        return out

    def _sample(self, h: Open, k: int, start: int, size: int) -> splice.Segment:
        """Bytes [start, start + size) of part `k` of `h`."""
        step, position, sample_id, _ = h.layout.parts[k]
        if self.prefetcher is not None and k not in h.data:
            with h.lock:
                if k not in h.data:
                    h.data[k] = self.prefetcher.take(step, position, sample_id)
        if k in h.data:
            return memoryview(h.data[k])[start : start + size]
        if h.layout.ranges is not None:
            fd, pos = h.layout.ranges[k]
            return splice.FileRange(fd, pos + start, size)
        where = self.reader.file_range(sample_id, start, size)
        if where is None:
            out = bytearray(size)
            self.reader.read_into(sample_id, memoryview(out), start)
            return out
        return splice.FileRange(*where)

    def _source_fd(self, source: int) -> int | None:
        try:
            return self.reader.source_fd(source)
        except DataError as e:
            raise OSError(errno.EIO, str(e)) from None

    def backing(self, fh: int) -> int | None:
        """The open source file whose bytes file `fh` shows, for passthrough (`fuse.session`), or None."""
        return self._handles[fh].fd

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            self._handles.pop(fh, None)
        return 0
