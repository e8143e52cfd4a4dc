"""One pass of `python -m bench --only dataset` in a fresh process:
`python -m bench.dataset_pass METHOD INDEX STATE DIR` reads rank RANK of WORLD's samples by
METHOD (the paths of `bench/dataset.py`) and prints {seconds, startup_s, samples, bytes, digest}
as JSON."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.dataset import RANK, WORLD


def read_pass(method: str, index_path: str, state_path: str, directory: str) -> dict[str, Any]:
    """Read rank RANK of WORLD's samples for one epoch by `method` (timed; each sample is dropped
    once read, as a training step drops it), then again for the sha256 of the (id, bytes) sequence."""
    import hashlib

    from tenplex.data import DatasetIndex, DataState, RankFiles

    if method.startswith(("loader", "batches")):
        import tenplex.data.torch_data  # noqa: F401 -- torch's import is not part of the pass
    index = DatasetIndex.load(index_path)
    files = RankFiles.build(index, DataState.load(state_path), WORLD, RANK)
    if method.startswith("batches"):  # persistent workers: a first epoch starts them, the next are timed
        return _batches_pass(index, files, int(method[-1]))
    if method in ("ring", "ring2", "bound"):
        from bench.dataset_limits import anchor_pass

        return anchor_pass(method, index, files)
    t0 = time.perf_counter()
    samples = _samples(method, index, files, directory)
    count, size = 1, len(next(samples)[1])
    startup = time.perf_counter() - t0 if method.startswith("loader") else 0.0
    for _, data in samples:
        count, size = count + 1, size + len(data)
    seconds = time.perf_counter() - t0 - startup
    sha = hashlib.sha256()
    for sample_id, data in _samples(method, index, files, directory):
        sha.update(sample_id.to_bytes(8, "little") + bytes(data))
    return {"seconds": seconds, "startup_s": startup, "samples": count, "bytes": size, "digest": sha.hexdigest()}


def _batches_pass(index: Any, files: Any, workers: int) -> dict[str, Any]:
    """`read_pass` for `RankBatches`: the first epoch (start-up, then the digest) starts the
    workers; the next `passes`, timed whole, read with them running. The workers read ahead up
    to `depth` chunks (the DataLoader's prefetch), some before the timed passes start: enough
    passes are timed that these are at most 1/20 of the chunks timed."""
    import hashlib

    from tenplex.data import SampleReader
    from tenplex.data.torch_data import RankBatches

    batches = RankBatches(SampleReader(index, decode=False), files.view, len(files.steps), workers)
    t0 = time.perf_counter()
    first = ((i, d) for b in batches for i, d in zip(b.ids.tolist(), b.samples))
    sha, pending = hashlib.sha256(), [next(first)]
    startup = time.perf_counter() - t0
    for sample_id, data in itertools.chain(pending, first):
        sha.update(sample_id.to_bytes(8, "little") + bytes(data))
    depth = workers * (batches._loader.prefetch_factor if workers else 0)
    passes = max(1, -(-20 * depth // max(len(batches.chunks), 1)))
    t0 = time.perf_counter()
    count = size = 0
    for b in itertools.chain.from_iterable(itertools.repeat(batches, passes)):
        count, size = count + len(b.samples), size + sum(len(d) for d in b.samples)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds / passes, "startup_s": startup, "samples": count // passes, "bytes": size // passes,
            "digest": sha.hexdigest(), "passes": passes}  # fmt: skip


def _samples(method: str, index: Any, files: Any, directory: str) -> Iterator[tuple[int, bytes]]:
    """(id, bytes) of the rank's samples in reading order, read by `method`."""
    if method == "direct":
        fds = [os.open(index.location(k), os.O_RDONLY) for k in range(len(index.files))]
        ids = files.view.ids_between(files.view.start, files.stop).tolist()
        fid, off, length = (a.tolist() for a in index.ranges(ids))
        return ((i, os.pread(fds[f], n, o)) for i, f, o, n in zip(ids, fid, off, length))
    if method.startswith("loader"):
        import torch.utils.data as tud

        from tenplex.data import SampleReader
        from tenplex.data.torch_data import RankIterableDataset

        dataset = RankIterableDataset(SampleReader(index, decode=False), files.view, len(files.steps))
        loader = tud.DataLoader(dataset, batch_size=None, num_workers=int(method[-1]))
        return ((int(i), d) for i, d in loader)
    if method in ("fusestep", "stepfiles"):
        return _step_samples(Path(directory))
    if method in ("fuseranges", "rangesfiles"):
        return _range_samples(Path(directory))
    return _fuse_samples(Path(directory))


def _fuse_samples(root: Path) -> Iterator[tuple[int, bytes]]:
    for step in sorted(os.listdir(root)):
        if step.startswith("step-") and not step.endswith(".bin"):
            for name in sorted(os.listdir(root / step)):
                with open(root / step / name, "rb", buffering=0) as f:
                    yield int(name.split("-")[1].split(".")[0]), f.read()


def _step_samples(root: Path) -> Iterator[tuple[int, memoryview]]:
    """A file per step: one open and one read each, its samples views of the bytes read (valid
    until the next step's read: each is consumed before)."""
    from tenplex.data.step_file import StepReader

    reader = StepReader()  # one buffer for every step, as a training loop keeps one
    for name in sorted(os.listdir(root)):
        if name.startswith("step-") and name.endswith(".bin"):
            batch = reader.read(root / name)
            yield from zip(batch.ids, batch.samples)


def _range_samples(root: Path) -> Iterator[tuple[int, memoryview]]:
    """The view's ranges file, read once, then each sample read from its source file through the
    view (passed through to the source by the kernel where the server can ask for it)."""
    from tenplex.data.ranges_file import RangesReader

    with RangesReader(root) as reader:  # one buffer for every step, as `_step_samples`
        for step in reader.ranges.steps:
            batch = reader.read(step)
            yield from zip(batch.ids, batch.samples)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: python -m bench.dataset_pass METHOD INDEX STATE DIR")
    print(json.dumps(read_pass(*sys.argv[1:5])))
