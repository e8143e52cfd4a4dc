"""`tenplex dataset`: build a sample index, print what each rank reads, inspect an index.

    tenplex dataset index PATH... -o INDEX [--format numpy|megatron|tfrecord] [--no-verify-crc]
    tenplex dataset order INDEX --global-batch G --seed S --schedule 0:4,37:3 [--epochs E]
                          [--tail drop|partial] [--uneven] [--state STATE]
    tenplex dataset inspect INDEX [--json]
    tenplex dataset mount INDEX DIR --rank R --world W (--state STATE | --seed S --global-batch G)
                          [--steps K] [--tail drop|partial] [--uneven] [--page-cache]

`order` prints one JSON line `{"epoch", "step", "rank", "samples"}` per rank and step, where
`step` is the global step counted from the start of training (as in the schedule), for every
step of E epochs (1..MAX_EPOCHS) starting at step 0 or at STATE's next step; lines stream out
as they are computed, and a reader that stops early (`| head`) ends the command quietly. Counts
are bounded: W (schedule, --world) by `tenplex.data.partition.MAX_WORLD`, --steps by MAX_STEPS. `mount` serves rank R's next K
steps (default: the rest of the epoch) as a read-only FUSE directory (`tenplex.runtime.fuse.dataset`:
a file per sample, a file per step, and the view's ranges over its source files, docs/dataset.md section 10.4) until SIGINT or SIGTERM, printing one line once it is live; SIGHUP re-reads STATE and switches
the view to its next step (a trainer rewrites STATE at each commit). A `DataError` ends in one line
`tenplex: error: ...` and exit code 2 (through the `tenplex` group's error handling). `inspect
--json` prints one document `tenplex.dataset-inspect/1` (docs/cli.md) with the facts of the text,
every file included.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from tenplex.cli.common import echo_json, log

if TYPE_CHECKING:
    from tenplex.data.index import DatasetIndex

TAILS = ("drop", "partial")
MAX_EPOCHS = 1_000_000
MAX_STEPS = 1_000_000  # a mount lists one directory per step
MAX_WORLD = 65536  # tenplex.data.partition.MAX_WORLD (not imported: the CLI loads the data layer lazily)
CHUNK = 1024  # order lines written at once
FORMATS = ("numpy", "megatron", "tfrecord")


@click.group("dataset")
def dataset() -> None:
    """Dataset state: sample indexes and what each data-parallel rank reads under rescaling."""


@dataset.command("index")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", required=True, metavar="INDEX", help="Write the index here (.npz, atomically).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Dataset format (default: from the extensions).")
@click.option("--no-verify-crc", is_flag=True, help="Skip TFRecord data CRCs (framing is still checked).")
def index_cmd(paths: tuple[str, ...], output: str, fmt: str | None, no_verify_crc: bool) -> None:
    """Index the samples in PATH... (files or directories, in the order given)."""
    from tenplex.data.formats import build_index

    index = build_index(list(paths), fmt, verify=not no_verify_crc)
    index.save(output)
    files = f"{len(index.files)} file" + "s" * (len(index.files) != 1)
    log.info("wrote %s (%d samples in %s, fingerprint %s)", output, len(index), files, index.fingerprint[:16])


@dataset.command("order")
@click.argument("index_path", metavar="INDEX")
@click.option("--global-batch", "-G", type=click.IntRange(min=1), required=True, help="Global batch size G.")
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), required=True, help="Order seed.")
@click.option("--schedule", required=True, help="step:W changes, e.g. 0:4,37:3 (global steps).")
@click.option("--epochs", type=click.IntRange(1, MAX_EPOCHS), default=1, show_default=True, help="Epochs to print.")
@click.option("--tail", type=click.Choice(TAILS), default="drop", show_default=True, help="Tail policy.")
@click.option("--uneven", is_flag=True, help="Allow W that does not divide G (counts differ by <= 1).")
@click.option("--state", "state_path", metavar="STATE", help="Start at this saved state's next step.")
def order_cmd(index_path: str, global_batch: int, seed: int, schedule: str, epochs: int, tail: str,
              uneven: bool, state_path: str | None) -> None:  # fmt: skip
    """Print, as JSON lines, the samples each rank reads at each step under a rescale schedule."""
    from tenplex.data.index import DatasetIndex
    from tenplex.data.schedule import Schedule, replay
    from tenplex.data.state import DataState

    index = DatasetIndex.load(index_path)
    plan = Schedule.parse(schedule)
    state = DataState.start(index, seed, global_batch, tail)
    if state_path is not None:
        saved = DataState.load(state_path)
        saved.check_matches(
            state_path, **{k: getattr(state, k) for k in ("fingerprint", "seed", "global_batch", "tail_policy")}
        )
        state = saved
    order = state.order_for(index, state_path or "state")
    start = state.step(order)
    stop = (state.epoch + epochs) * order.steps_per_epoch
    _stream(json.dumps(rank_step.to_json()) for rank_step in replay(order, plan, stop, start, uneven))


def _stream(lines: Iterator[str]) -> None:
    """Write `lines` to stdout as they come, CHUNK at a time; a closed pipe ends the command (exit 0)."""
    try:
        while chunk := list(itertools.islice(lines, CHUNK)):
            click.echo("".join(line + "\n" for line in chunk), nl=False)  # click.echo flushes
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no flush at exit into the closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_index(index: DatasetIndex, source: str, limit: int = 10) -> str:
    """A readable summary of `index`: format, files, sample sizes, fingerprint, first files."""
    import numpy as np

    lengths = index.length
    per_file = np.bincount(index.file_id, minlength=len(index.files))
    lines = [
        f"index:         {source}",
        f"sample format: {index.sample_format}" + (f" (tokens {index.dtype})" if index.dtype else ""),
        f"root:          {index.root or '(names are locations)'}",
        f"files:         {len(index.files)} ({_human(sum(f.size for f in index.files))})",
        f"samples:       {len(index)} ({_human(index.total_bytes())})",
    ]
    if len(index):
        lines.append(f"sample bytes:  min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}")
    lines.append(f"fingerprint:   {index.fingerprint}")
    width = max([len(f.name) for f in index.files[:limit]] + [4])
    lines.append(f"  {'file':<{width}}  {'samples':>8}  {'bytes':>12}")
    lines += [f"  {f.name:<{width}}  {per_file[k]:>8}  {f.size:>12}" for k, f in enumerate(index.files[:limit])]
    if len(index.files) > limit:
        lines.append(f"  ... and {len(index.files) - limit} more files")
    return "\n".join(lines) + "\n"


def index_facts(index: DatasetIndex, source: str) -> dict[str, Any]:
    """What `describe_index` says, as JSON, with every file."""
    import numpy as np

    lengths = index.length
    per_file = np.bincount(index.file_id, minlength=len(index.files))
    sizes = {"min": int(lengths.min()), "median": int(np.median(lengths)), "max": int(lengths.max())} if len(index) else None
    return {"format": "tenplex.dataset-inspect/1", "index": source, "sample_format": index.sample_format,
            "dtype": index.dtype or None, "root": index.root or None, "samples": len(index),
            "sample_bytes": int(index.total_bytes()), "sample_sizes": sizes, "fingerprint": index.fingerprint,
            "file_bytes": sum(f.size for f in index.files),
            "files": [{"name": f.name, "samples": int(per_file[k]), "bytes": f.size} for k, f in enumerate(index.files)]}  # fmt: skip


@dataset.command("inspect")
@click.argument("index_path", metavar="INDEX")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tenplex.dataset-inspect/1).")
def inspect_cmd(index_path: str, as_json: bool) -> None:
    """Describe a dataset index: format, files, sample sizes and fingerprint."""
    from tenplex.data.index import DatasetIndex

    index = DatasetIndex.load(index_path)
    if as_json:
        echo_json(index_facts(index, index_path))
        return
    click.echo(describe_index(index, index_path), nl=False)


def _mount_state(index: DatasetIndex, state_path: str | None, seed: int | None, global_batch: int | None,
                 tail: str) -> Any:  # fmt: skip
    """The DataState to mount: STATE, or the start of (seed, G, tail). Raises DataError/UsageError."""
    from tenplex.data.state import DataState

    if state_path is not None:
        if seed is not None or global_batch is not None:
            raise click.UsageError("give either --state or --seed and --global-batch, not both")
        state = DataState.load(state_path)
        state.order_for(index, state_path)
        return state
    if seed is None or global_batch is None:
        raise click.UsageError("give --state STATE, or --seed and --global-batch to start at step 0")
    return DataState.start(index, seed, global_batch, tail)


@dataset.command("mount")
@click.argument("index_path", metavar="INDEX")
@click.argument("directory", metavar="DIR")
@click.option("--rank", type=click.IntRange(min=0), required=True, help="This data-parallel rank.")
@click.option("--world", type=click.IntRange(1, MAX_WORLD), required=True, help="Data-parallel size W.")
@click.option("--state", "state_path", metavar="STATE", help="Committed state (JSON); SIGHUP re-reads it.")
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), help="Order seed (without --state).")
@click.option("--global-batch", "-G", type=click.IntRange(min=1), help="Global batch size (without --state).")
@click.option("--steps", type=click.IntRange(0, MAX_STEPS), help="Steps to show (default: to the end of the epoch).")
@click.option("--tail", type=click.Choice(TAILS), default="drop", show_default=True, help="Tail policy.")
@click.option("--uneven", is_flag=True, help="Allow W that does not divide G (counts differ by <= 1).")
@click.option("--page-cache", is_flag=True, help="Serve every sample file through the page cache, for readers that "
              "mmap them shared (default: files of 256 KiB and more use direct I/O, which refuses that unless root serves the view; step files always do).")  # fmt: skip
def mount_cmd(index_path: str, directory: str, rank: int, world: int, state_path: str | None, seed: int | None,
              global_batch: int | None, steps: int | None, tail: str, uneven: bool, page_cache: bool) -> None:  # fmt: skip
    """Serve rank R's upcoming samples at DIR (read-only FUSE) until SIGINT/SIGTERM."""
    import signal
    import threading

    from tenplex._signals import handling
    from tenplex.cli.store import check_mount_point
    from tenplex.data.index import DatasetIndex
    from tenplex.runtime.fuse.dataset import is_mounted, mount
    from tenplex.runtime.fuse.dataset.ops import DIRECT_IO_FROM

    check_mount_point(directory)  # a missing DIR or a mount point: one line, before anything else
    if state_path is not None:  # re-read on SIGHUP, when FUSE may have changed the cwd
        state_path = os.path.abspath(state_path)
    index = DatasetIndex.load(index_path)
    state = _mount_state(index, state_path, seed, global_batch, tail)
    stop, reload = threading.Event(), threading.Event()
    handlers = {signal.SIGINT: stop.set, signal.SIGTERM: stop.set, signal.SIGHUP: reload.set}
    with handling({s: lambda *_, f=f: f() for s, f in handlers.items()}):
        direct_io_from = None if page_cache else DIRECT_IO_FROM
        with mount(
            index, state, world, rank, directory, steps=steps, uneven=uneven, direct_io_from=direct_io_from
        ) as view:
            files = view.files
            os.stat(view.directory)  # the kernel's first request: the server knows what it offers
            through = "; sources/ passed through" if view.passthrough else ""
            click.echo(f"tenplex: mounted rank {rank} of {world} at {view.directory}: steps "
                       f"{files.view.start}..{files.stop - 1} of {index_path}{through}", nl=True)  # fmt: skip
            while not stop.wait(0.1) and is_mounted(view.directory):
                if reload.is_set() and state_path is not None:
                    reload.clear()
                    _reload(view, state_path, world, rank)


def _reload(view: Any, state_path: str, world: int, rank: int) -> None:
    """Switch `view` to STATE's next step; a bad STATE is reported and the old view kept."""
    from tenplex.data.errors import DataError
    from tenplex.data.state import DataState

    try:
        files = view.switch(DataState.load(state_path), world, rank)
    except DataError as e:
        log.error("error: %s (still serving generation %d)", e, view.files.generation)
        return
    click.echo(f"tenplex: switched to steps {files.view.start}..{files.stop - 1} (generation {files.generation})")
