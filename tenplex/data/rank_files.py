"""One rank's upcoming samples as a tree of files: names, sizes and header bytes (no I/O here).

Layout of a view (what `tenplex.runtime.fuse.dataset` mounts at DIR):

    DIR/.state.json                    this view, as JSON (`RankFiles.state_doc`)
    DIR/step-SSSSSS/                   one directory per global step s in [start, stop)
    DIR/step-SSSSSS/PPP-IIII.EXT       the sample at position PPP of the rank's share of step s,
                                       whose sample id is IIII; sorted names = reading order
    DIR/step-SSSSSS.bin                the same samples as ONE file, a table of their ids and
                                       offsets first (`tenplex.data.step_file`)
    DIR/ranges.bin                     where every sample of the view lies in the source files
                                       (`tenplex.data.ranges_file`)
    DIR/sources/FFFFFF                 source file F of the index, its bytes as they are

Numbers are zero-padded: steps to 6 digits, positions to the digits of G - 1 (at least 3), ids to
the digits of N - 1, so that names sort in reading order and depend only on the job (index and
G), never on W. A sample file's path therefore always names the same bytes, in every view that
has it: the view can change under a reader without any such file changing content. A step file
is the view's (its header names W, the rank and the view's generation), so it is served without
the page cache. EXT and bytes by format:
- numpy: the sample's bytes as `.npy` or `.npz` (by the source file's suffix, else its magic);
- megatron: `.npy`, a synthesized `.npy` header (1-D array of the token dtype) + the sample bytes;
- tfrecord: `.tfrecord`, the framed record (a valid one-record TFRecord file);
- raw: `.bin`, the sample bytes.

Invariants:
- start = the state's next step; start <= stop; the view shows steps [start, stop) only;
- `parse` accepts exactly the names `name` produces for this view, and nothing else;
- generation >= 0 (a FUSE view publishes views with increasing generations).
"""

from __future__ import annotations

import functools
import io
import json
import re
from typing import Any

import attrs
import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.index import DatasetIndex
from tenplex.data.partition import RankView, rank_view
from tenplex.data.ranges_file import build as build_ranges
from tenplex.data.ranges_file import source_name
from tenplex.data.state import DataState
from tenplex.data.step_file import StepFile, data_offset

STATE_FILE = ".state.json"
STEP_SUFFIX = ".bin"  # DIR/step-SSSSSS.bin: a step file
RANGES_FILE = "ranges.bin"  # DIR/ranges.bin: the view's ranges file
VIEW_VERSION = 1
_SUFFIX = {"megatron": ".npy", "tfrecord": ".tfrecord", "raw": ".bin"}
_STEP = re.compile(r"step-(\d{6,})")
_FILE = re.compile(r"(\d+)-(\d+)(\.[a-z]+)")


@functools.lru_cache(maxsize=256)
def npy_header(dtype: str, count: int) -> bytes:
    """The `.npy` (v1.0) header of a 1-D little-endian array of `count` items of `dtype`."""
    buf = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype).newbyteorder("<"))
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": (count,)})
    return buf.getvalue()


def numpy_suffix(name: str, head: bytes) -> str:
    """`.npz` or `.npy` for a numpy-format sample in file `name` that starts with `head`."""
    if name.endswith((".npy", ".npz")):
        return name[-4:]
    return ".npz" if head[:2] == b"PK" else ".npy"


@attrs.frozen
class SampleFile:
    """The file of position `position` of step `step`: `header` then the sample's `length` bytes."""

    step: int
    position: int
    sample_id: int
    length: int
    header: bytes = b""

    @property
    def size(self) -> int:
        return len(self.header) + self.length


@attrs.frozen(eq=False)
class RankFiles:
    """Rank `view.rank` of `view.world`: global steps [view.start, stop) of `index` as files."""

    index: DatasetIndex
    state: DataState
    view: RankView
    stop: int
    generation: int = 0
    _ids: dict[int, list[int]] = attrs.field(factory=dict, init=False, repr=False)  # step -> share, memoized
    _sizes: dict[int, int] = attrs.field(factory=dict, init=False, repr=False)  # step -> its step file's size
    _ranges: list[bytes] = attrs.field(factory=list, init=False, repr=False)  # the ranges file, once built

    def __attrs_post_init__(self) -> None:
        if self.view.start != self.state.step(self.view.order):
            raise DataError(f"view: starts at step {self.view.start}, but the state's next step is "
                            f"{self.state.step(self.view.order)}")  # fmt: skip
        if isinstance(self.stop, bool) or not isinstance(self.stop, int) or self.stop < self.view.start:
            raise DataError(f"stop: expected a step >= {self.view.start}, got {self.stop!r}")
        if isinstance(self.generation, bool) or not isinstance(self.generation, int) or self.generation < 0:
            raise DataError(f"generation: expected an integer >= 0, got {self.generation!r}")

    @classmethod
    def build(cls, index: DatasetIndex, state: DataState, world: int, rank: int, steps: int | None = None,
              uneven: bool = False, generation: int = 0) -> RankFiles:  # fmt: skip
        """The view of `steps` steps from `state`'s next step (None: to the end of its epoch).
        Raises DataError if the state was made for another index or W cannot split G."""
        order = state.order_for(index)
        view = rank_view(state, order, world, rank, uneven)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise DataError(f"steps: expected an integer >= 0, got {steps!r}")
        stop = (state.epoch + 1) * order.steps_per_epoch if steps is None else view.start + steps
        return cls(index, state, view, stop, generation)

    @property
    def steps(self) -> range:
        return range(self.view.start, self.stop)

    def share(self, step: int) -> np.ndarray:
        """The sample ids of `step` (in [start, stop)), in reading order."""
        return self.view.step_at(step).ids

    def ids(self, step: int) -> list[int]:
        """`share(step)` as a list, computed once per step (file-system calls ask often)."""
        if step not in self._ids:
            self._ids[step] = self.share(step).tolist()
        return self._ids[step]

    @staticmethod
    def step_name(step: int) -> str:
        return f"step-{step:06d}"

    def parse_step(self, name: str, suffix: str = "") -> int | None:
        """The step that directory `name` shows (with `suffix` ".bin": step file `name`), or None
        if this view has no such directory (file)."""
        m = _STEP.fullmatch(name[: len(name) - len(suffix)]) if name.endswith(suffix) else None
        step = int(m[1]) if m else -1
        return step if m and self.step_name(step) + suffix == name and step in self.steps else None

    def step_file_size(self, step: int) -> int:
        """`step_file(step).size`, computed once per step without keeping the step's ids (a
        listing asks it of every step)."""
        if step not in self._sizes:
            share = self.share(step)
            self._sizes[step] = data_offset(len(share)) + int(self.index.length[share].sum())
        return self._sizes[step]

    def step_file(self, step: int) -> StepFile:
        """The step file of `step` (in [start, stop)): the rank's share as one file."""
        ids = self.ids(step)
        lengths = self.index.length[ids].tolist() if ids else []
        v = self.view
        return StepFile(self.generation, step, v.world, v.rank, tuple(ids), tuple(int(k) for k in lengths))

    def ranges_bytes(self) -> bytes:
        """The view's ranges file (`tenplex.data.ranges_file`), built once."""
        if not self._ranges:
            shares = [self.share(s) for s in self.steps]
            ids = np.concatenate([np.zeros(0, np.int64), *shares])
            rows = np.stack([ids, *self.index.ranges(ids)], axis=1)
            v = self.view
            self._ranges.append(build_ranges(self.generation, v.world, v.rank, v.start, len(self.index.files),
                                                  np.array([len(x) for x in shares], np.int64), rows))  # fmt: skip
        return self._ranges[0]

    def source(self, name: str) -> int | None:
        """The source file that `DIR/sources/<name>` shows, or None."""
        f = int(name) if name.isdigit() else -1
        return f if 0 <= f < len(self.index.files) and source_name(f) == name else None

    def name(self, position: int, sample_id: int, suffix: str) -> str:
        width = max(3, len(str(self.view.order.global_batch - 1)))
        return f"{position:0{width}d}-{sample_id:0{len(str(len(self.index) - 1))}d}{suffix}"

    def names(self, step: int, suffixes: list[str]) -> list[str]:
        """The file names of `step`'s directory, given each sample's suffix, in reading order."""
        return [self.name(k, i, x) for k, (i, x) in enumerate(zip(self.ids(step), suffixes))]

    def suffix(self, sample_id: int, head: bytes = b"") -> str:
        """EXT of sample `sample_id` (module doc), given its first bytes `head` if `needs_head`."""
        fmt = self.index.sample_format
        if fmt != "numpy":
            return _SUFFIX[fmt]
        return numpy_suffix(self._file_name(sample_id), head)

    def needs_head(self, sample_id: int) -> bool:
        """Whether `suffix` needs the sample's first 2 bytes: numpy in a file not named .npy/.npz."""
        return self.index.sample_format == "numpy" and not self._file_name(sample_id).endswith((".npy", ".npz"))

    def _file_name(self, sample_id: int) -> str:
        return self.index.files[int(self.index.file_id[sample_id])].name

    def parse(self, step: int, name: str) -> tuple[int, int, str] | None:
        """(position, sample id, suffix) named by `name` in step `step`'s directory, or None
        unless this view has that position with that id (the suffix is the caller's to check)."""
        m = _FILE.fullmatch(name)
        if not m:
            return None
        position, sample_id, suffix = int(m[1]), int(m[2]), m[3]
        ids = self.ids(step)
        if position >= len(ids) or ids[position] != sample_id or self.name(position, sample_id, suffix) != name:
            return None
        return position, sample_id, suffix

    def sample_file(self, step: int, position: int) -> SampleFile:
        sample_id = self.ids(step)[position]
        length = int(self.index.length[sample_id])
        header = b""
        if self.index.sample_format == "megatron":
            itemsize = np.dtype(self.index.dtype).itemsize
            header = npy_header(self.index.dtype, length // itemsize)
        return SampleFile(step, position, sample_id, length, header)

    def state_doc(self) -> dict[str, Any]:
        """What `.state.json` holds: this view's step, epoch, W, rank and the committed state."""
        epoch = self.view.order.locate(self.view.start)[0]
        return {
            "version": VIEW_VERSION, "generation": self.generation, "epoch": epoch, "step": self.view.start,
            "stop": self.stop, "world": self.view.world, "rank": self.view.rank, "uneven": self.view.uneven,
            "samples": len(self.index), "state": self.state.to_json(),
        }  # fmt: skip

    def state_bytes(self) -> bytes:
        return (json.dumps(self.state_doc(), sort_keys=True) + "\n").encode()
