"""Paths of a dataset view (`dataset.ops`): what each names, and the names of a listing.

`Names.resolve(files, path)` gives a path's node in the view `files`, remembered for the current
view (a lookup, a getattr and an open each resolve it): ("root", None), ("state", None),
("ranges", None), ("sources", None), ("source", F), ("step", step), ("sample", SampleFile) or
("steps", Layout); `entries` lists a directory (-1: `DIR/sources`).

Raises: OSError ENOENT for a path the view does not have, EIO where a sample's suffix needs its
first bytes and they cannot be read.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from tenplex.data.errors import DataError
from tenplex.data.ranges_file import SOURCES, source_name
from tenplex.data.rank_files import RANGES_FILE, STATE_FILE, STEP_SUFFIX, RankFiles, SampleFile
from tenplex.data.reader import SampleReader
from tenplex.runtime.fuse.dataset.layout import step_layout

_MEMO_PATHS = 1 << 16  # resolved paths remembered per view


def _enoent(path: str) -> OSError:
    return OSError(errno.ENOENT, f"{os.strerror(errno.ENOENT)}: {path}")


class Names:
    """The paths of the current view `files` (`reset` on a switch); sample suffixes are kept across views."""

    def __init__(self, files: RankFiles, reader: SampleReader) -> None:
        self.reader = reader
        self._suffixes: dict[int, str] = {}
        self._nodes: tuple[RankFiles, dict[str, tuple[str, Any]]] = (files, {})

    def reset(self, files: RankFiles) -> None:
        """`files` is the current view now: forget the paths resolved in the last one."""
        self._nodes = (files, {})

    def suffix(self, files: RankFiles, sample_id: int) -> str:
        if sample_id not in self._suffixes:
            head = bytearray(2)
            if files.needs_head(sample_id):
                try:
                    self.reader.read_into(sample_id, memoryview(head))
                except DataError as e:
                    raise OSError(errno.EIO, str(e)) from None
            self._suffixes[sample_id] = files.suffix(sample_id, bytes(head))
        return self._suffixes[sample_id]

    def resolve(self, files: RankFiles, path: str) -> tuple[str, Any]:
        """The node of `path` in `files` (module doc), remembered while `files` is the current view."""
        memo_files, memo = self._nodes
        if memo_files is not files:
            return self._parse_path(files, path)
        if path not in memo:
            if len(memo) >= _MEMO_PATHS:
                memo.clear()
            memo[path] = self._parse_path(files, path)
        return memo[path]

    def _parse_path(self, files: RankFiles, path: str) -> tuple[str, Any]:
        if path == "/":
            return "root", None
        parts = path[1:].split("/")
        if parts == [STATE_FILE]:
            return "state", None
        if parts == [RANGES_FILE]:
            return "ranges", None
        if parts[0] == SOURCES and len(parts) <= 2:
            source = files.source(parts[1]) if len(parts) == 2 else -1
            if source is None:
                raise _enoent(path)
            return ("source", source) if len(parts) == 2 else ("sources", None)
        if len(parts) == 1 and (step := files.parse_step(parts[0], STEP_SUFFIX)) is not None:
            return "steps", step_layout(files.step_file(step), self.reader)
        step = files.parse_step(parts[0])
        if step is None or len(parts) > 2:
            raise _enoent(path)
        if len(parts) == 1:
            return "step", step
        parsed = files.parse(step, parts[1])
        if parsed is None or parsed[2] != self.suffix(files, parsed[1]):
            raise _enoent(path)
        return "sample", files.sample_file(step, parsed[0])

    def entries(self, files: RankFiles, step: int | None) -> list[str]:
        if step == -1:  # DIR/sources
            return [source_name(f) for f in range(len(files.index.files))]
        if step is None:
            steps = (n for s in files.steps for n in (files.step_name(s), files.step_name(s) + STEP_SUFFIX))
            return [STATE_FILE, RANGES_FILE, SOURCES, *steps]
        return files.names(step, [self.suffix(files, i) for i in files.ids(step)])

    def remember(self, files: RankFiles, directory: str, names: list[str], nodes: list[SampleFile]) -> None:
        """Resolve a listed step's sample paths ahead (an open then parses nothing), for the current view only."""
        memo_files, memo = self._nodes
        if memo_files is files and len(memo) + len(names) <= _MEMO_PATHS:
            memo.update((f"{directory}/{n}", ("sample", f)) for n, f in zip(names, nodes))

