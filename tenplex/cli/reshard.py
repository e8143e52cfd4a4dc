"""`tenplex reshard`: a checkpoint directory (tenplex, Megatron-LM or PyTorch DCP) in another layout.

    tenplex reshard SRC_DIR --to DST --out OUT_DIR [--from F] [--format F] [--workers N] [--central]
                    [--trust-pickles] [--hf-arch llama [--hf-vocab V]] [--json]

OUT_DIR is complete or absent. Progress goes to stderr, and only when stderr is a terminal (where
the transient bar erases itself), so an error is always the first line on stderr. The result is
one line on stdout, or with `--json` one document `tenplex.reshard/1` (docs/cli.md): src, out,
their formats, workers, bytes moved between ranks, seconds, the summary line.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import click

from tenplex.cli.common import echo_json, load_state, numpy_with_one_blas_thread, skip_teardown

JSON_FORMAT = "tenplex.reshard/1"

MAX_WORKERS = 256  # agent processes on one machine; each costs a Python process and a UCX worker


@click.command("reshard")
@click.argument("src_dir", type=click.Path(file_okay=False))
@click.option("--to", "dst", required=True, metavar="DST",
              help="Target layout: dp=N[,tp=M|,pp=P] (DeepSpeed ZeRO-1/2), tp=4,pp=1[,dp=2][,vpp=2] (Megatron), a DTensor layout JSON (DCP; "
                   "`tenplex layout SRC_DIR` prints the current one), a PTC JSON file or a model spec; "
                   "with --format hf: whole or max_shard_size=SIZE.")  # fmt: skip
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output checkpoint directory (must not exist; complete or absent).")  # fmt: skip
@click.option("--from", "src_fmt", type=click.Choice(["tenplex", "megatron", "megatron-dist", "dcp", "deepspeed", "hf"]),
              help="Format of SRC_DIR (default: detected).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["tenplex", "megatron", "megatron-dist", "dcp", "deepspeed", "hf"]),
              help="Format of OUT_DIR (default: SRC_DIR's).")  # fmt: skip
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1, show_default=True,
              help=f"Local workers (1: in-process; >= 2: one process each, at most {MAX_WORKERS}).")  # fmt: skip
@click.option("--central", is_flag=True, help="Baseline (tenplex format only): gather on worker w0, then scatter.")
@click.option("--trust-pickles", is_flag=True,
              help="Unpickle any class in Megatron rank files and DCP .metadata (they can run code): "
                   "only for checkpoints from a source you trust.")  # fmt: skip
@click.option("--hf-arch", type=click.Choice(["llama"]),
              help="With --format hf and a Megatron source: write a transformers model of this architecture "
                   "(Hugging Face names, QKV and SwiGLU split, vocabulary padding removed, config.json); with an hf "
                   "source and --format megatron-dist: a torch_dist tree for --to tp=T,pp=P.")  # fmt: skip
@click.option("--hf-vocab", type=click.IntRange(1),
              help="With --hf-arch: the tokenizer's vocabulary V (default: args.vocab_size, else the padded size).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document (tenplex.reshard/1).")
def reshard_cmd(src_dir: str, dst: str, out_dir: str, src_fmt: str | None, fmt: str | None, workers: int,
                central: bool, trust_pickles: bool, hf_arch: str | None, hf_vocab: int | None, as_json: bool) -> None:  # fmt: skip
    """Reshard the checkpoint SRC_DIR (tenplex, Megatron-LM or PyTorch DCP) to DST's layout."""
    from tenplex.frameworks.formats.kinds import FormatError, detect

    if hf_vocab is not None and hf_arch is None:
        raise FormatError("--hf-vocab applies with --hf-arch only")
    src_fmt = src_fmt or detect(src_dir)
    if src_fmt == "tenplex" and fmt in (None, "tenplex") and hf_arch is None:
        r = _without_gc(_reshard_tenplex, src_dir, dst, out_dir, workers, central)
        if not central:  # its threads and worker processes are joined, OUT is durable: nothing for exit handlers
            skip_teardown()
        doc = {"src": src_dir, "src_format": "tenplex", "out": out_dir, "out_format": "tenplex", "workers": r.workers,
               "bytes_moved": r.bytes_moved, "seconds": {"total": r.seconds}, "summary": r.summary(),
               "verified": r.verified, "central": r.central, "network_bytes": r.network_bytes}  # fmt: skip
    else:
        if central:
            raise FormatError("--central applies to tenplex checkpoint directories only")
        numpy_with_one_blas_thread()
        from tenplex.frameworks.formats.conversion import convert  # other formats only

        done = convert(src_dir, dst, out_dir, load_state, src_fmt=src_fmt, fmt=fmt, workers=workers,
                       trust_pickles=trust_pickles, hf_arch=hf_arch, hf_vocab=hf_vocab)  # fmt: skip
        doc = done.to_json()
    _print(doc, as_json)


def _print(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json({"format": JSON_FORMAT, **doc})
    else:
        click.echo(doc["summary"])


def _without_gc(fn: Any, *args: Any) -> Any:
    """`fn(*args)` without the cyclic collector: reading DST's PTC allocates ~10^5 objects and no
    cycles, and the collector's scans cost it up to 2x (`tenplex.compiler.nogc`, which imports
    the compiler and so numpy). Those objects are not scanned afterwards either (see below)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn(*args)
    finally:
        if enabled:
            # what was allocated meanwhile goes to the oldest generation unscanned (`freeze`, then
            # `unfreeze`: two list splices): re-enabled, the collector would otherwise scan all of
            # it at the next allocation, 5-14 ms just before the result is printed
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def _reshard_tenplex(src_dir: str, dst: str, out_dir: str, workers: int, central: bool) -> Any:
    """OUT's tree made and its files being allocated (`OutDir`) as soon as DST is parsed, so that
    the helper allocates on the other core while this one imports numpy and the compiler (~0.2
    s), then the reshard (`--central` as before: no `OutDir`)."""
    from tenplex.runtime.checkpoint.tree import OutDir

    dst_ptc = load_state(dst)
    if central:
        return _reshard(src_dir, dst_ptc, out_dir, workers, True, None)
    with OutDir(dst_ptc, out_dir) as outdir:  # committed by the reshard; deleted if anything fails first
        return _reshard(src_dir, dst_ptc, out_dir, workers, False, outdir)


def _reshard(src_dir: str, dst_ptc: Any, out_dir: str, workers: int, central: bool, outdir: Any) -> Any:
    """`runtime.reshard.reshard`, numpy imported first (one BLAS thread), with a progress bar on a terminal."""
    numpy_with_one_blas_thread()
    from tenplex.runtime.reshard import reshard

    if not sys.stderr.isatty():  # a bar off a terminal is only a stray blank line before an error (and rich costs an import)
        return reshard(src_dir, dst_ptc, out_dir, workers=workers, central=central, outdir=outdir)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("rounds", total=None)

        def on_round(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return reshard(src_dir, dst_ptc, out_dir, workers=workers, central=central, on_round=on_round, outdir=outdir)
