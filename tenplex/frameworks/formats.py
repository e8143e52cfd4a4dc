"""Checkpoint formats by name, for `tenplex reshard --from/--format` and `tenplex inspect`.

Formats: `tenplex` (a directory with `ptc.json` + `<partition>/<path>.npy`, `runtime.reshard`),
`megatron` (a legacy Megatron-LM tree), `megatron-dist` (Megatron's `torch_dist`: a tree or a bare
dist_checkpointing directory; `--from megatron` takes it too), `dcp` (a PyTorch Distributed Checkpoint directory); `structure` (the reference's per-rank
structure JSON: shapes only, so a PTC for `tenplex compile`/`inspect`, never a data source).
`detect(dir)` tells them apart by the files they must have. `convert(src, to, out)` reshards
SRC into the layout `to` and writes OUT in `fmt` (default: SRC's format):

- same format: the format's own reshard (`reshard`, `reshard_megatron`, `reshard_dcp`);
- another format: read SRC into a PTC triple, move it into the dst PTC (`reshard_arrays`), and
  write that with the target format's writer. Megatron output needs a Megatron source (the
  args, names and optimizer structure come from it).

`convert` returns a `Converted` (the facts `tenplex reshard` prints as a line, or as JSON with
`--json`); `inspect_report(dir)` returns the format, the findings and the PTC that `inspect`
describes, for `tenplex inspect --json`.

`to` means what the source format means by a layout: `tp=4,pp=1[,dp=2][,vpp=2]` for Megatron
(the model stays the checkpoint's), a DTensor layout JSON (file or text) for DCP, a PTC JSON
file or model spec for tenplex; a PTC JSON file or model spec is accepted for any source.

Trust: Megatron rank files and DCP `.metadata` are pickles. They are unpickled with allow-lists
of the classes those formats hold (`megatron.pickles`, `dcp.metadata`); `trust_pickles=True`
(`--trust-pickles`) lifts the lists for checkpoints from a trusted source. `inspect` raises when
a checkpoint cannot be read (the CLI exits 2): only a readable checkpoint is described.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC

FORMATS = ("tenplex", "megatron", "megatron-dist", "dcp")


class FormatError(TenplexError):
    """A directory in no known format, or a conversion that cannot be done."""


@attrs.frozen
class Converted:
    """What `convert` did: source and output (path and format), workers, the bytes the verified
    plan moved between ranks, seconds (in all, and per phase where the path times them), and the
    one-line summary the CLI prints."""

    src: str
    src_format: str
    out: str
    out_format: str
    workers: int
    bytes_moved: int
    seconds: dict[str, float]
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "verified": True}


def detect(path: str | os.PathLike) -> str:
    """The format of checkpoint directory `path`. Raises FormatError naming the path."""
    p = Path(path)
    if not p.is_dir():
        raise FormatError(f"{p}: not a directory")
    if (p / "ptc.json").is_file():
        return "tenplex"
    if _is_megatron_dist(p):
        return "megatron-dist"
    if (p / ".metadata").is_file():
        return "dcp"
    if (p / "latest_checkpointed_iteration.txt").is_file() or any(p.glob("iter_*")) or (p / "release").is_dir():
        return "megatron"
    if (p / "rank_map.json").is_file():
        return "structure"  # the reference's per-rank structure JSON: a layout without data
    raise FormatError(f"{p}: not a checkpoint tenplex reads (no ptc.json, metadata.json, .metadata, "
                      "latest_checkpointed_iteration.txt, iter_*/ or rank_map.json)")  # fmt: skip


def _is_megatron_dist(p: Path) -> bool:
    """A torch_dist step directory (even half-written: `megatron_dist` says what it lacks), bare
    or named by a Megatron-LM tree's tracker."""
    from tenplex.frameworks.megatron_dist.files import CONFIG, is_dist_step, locate

    if (p / CONFIG).is_file() or (is_dist_step(p) and (p / "common.pt").is_file()):
        return True
    if not (p / "latest_checkpointed_iteration.txt").is_file():
        return False
    try:
        return is_dist_step(locate(p).step)
    except TenplexError:
        return False  # the legacy reader names what is wrong with the tracker


def read(path: str | os.PathLike, fmt: str, *, trust_pickles: bool = False) -> tuple[PTC, dict, dict, Any]:
    """(PTC, sub-tensor id -> array, partition id -> values, format metadata or None)."""
    if fmt == "megatron":
        from tenplex.frameworks.megatron.read import read_megatron

        ckpt = read_megatron(path, trust_pickles=trust_pickles)
        return ckpt.ptc, ckpt.arrays, ckpt.values, ckpt.meta
    if fmt == "dcp":
        from tenplex.frameworks.dcp.read import read_dcp

        return (*read_dcp(path, trust_pickles=trust_pickles), None)
    from tenplex.runtime.checkpoint.directory import read_checkpoint

    return (*read_checkpoint(path), None)


def dst_ptc(fmt: str, src: PTC, meta: Any, to: str, load_state: Callable[[str], PTC]) -> PTC:
    """The dst PTC for layout text `to` in source format `fmt` (see the module docstring)."""
    if fmt == "megatron" and "=" in to and not to.endswith(".json"):
        from tenplex.frameworks.megatron.meta import cluster_for
        from tenplex.frameworks.megatron.reshard import target_layout
        from tenplex.frontends.transformer import build_ptc

        parallel = target_layout(meta, to)
        return build_ptc(meta.model, parallel, cluster_for(parallel))
    if fmt == "dcp" and _is_mesh_layout(to):
        from tenplex.frameworks.dtensor.mesh import MeshLayout
        from tenplex.frameworks.dtensor.mesh import dst_ptc as mesh_ptc

        return mesh_ptc(src, MeshLayout.from_json(to))
    return load_state(to)


def _is_mesh_layout(to: str) -> bool:
    if to.lstrip().startswith("{"):
        return True
    path = Path(to)
    if not path.is_file():
        return False
    with open(path, "rb") as f:  # a regular file: only its start decides
        return b'"mesh"' in f.read(4096)


def convert(src_dir: str, to: str, out_dir: str, load_state: Callable[[str], PTC], *, src_fmt: str | None = None,
            fmt: str | None = None, workers: int = 1, trust_pickles: bool = False) -> Converted:  # fmt: skip
    """Reshard SRC into `to` and write OUT in `fmt`; returns what was done (`Converted`).
    `trust_pickles`: see the module docstring.

    Raises FormatError (unknown format, impossible conversion, existing OUT) and the readers',
    compiler's and runtime's errors."""
    src_fmt = src_fmt or detect(src_dir)
    if src_fmt == "structure":
        raise FormatError(f"{src_dir} is a structure directory (shapes only, no data): use it as a PTC "
                          "(tenplex compile/inspect), not as a checkpoint to reshard")  # fmt: skip
    if src_fmt == "megatron" and detect(src_dir) == "megatron-dist":
        src_fmt = "megatron-dist"  # `--from megatron` names the framework; the files tell the format
    fmt = fmt or src_fmt
    if Path(out_dir).exists():
        raise FormatError(f"{out_dir}: already exists (refusing to overwrite)")
    if fmt == "megatron-dist" or src_fmt == "megatron-dist":
        return _convert_megatron_dist(src_dir, to, out_dir, src_fmt, fmt, workers, trust_pickles)
    if fmt == "megatron":
        if src_fmt != "megatron" or "=" not in to or to.endswith(".json"):
            raise FormatError(f"Megatron output needs a Megatron source and a layout like tp=4,pp=1 (got {src_fmt} "
                              f"{src_dir} and {to!r}): args, parameter names and optimizer groups come from the source")  # fmt: skip
        from tenplex.frameworks.megatron.reshard import reshard_megatron

        m = reshard_megatron(src_dir, to, out_dir, workers, trust_pickles=trust_pickles)
        seconds = {"total": m.seconds, **dict(m.phases)}
        return Converted(src_dir, src_fmt, out_dir, fmt, workers, m.bytes_moved, seconds, m.summary())
    if fmt == src_fmt == "dcp" and _is_mesh_layout(to):
        from tenplex.frameworks.dcp.reshard import reshard_dcp

        d = reshard_dcp(src_dir, to, out_dir, workers, trust_pickles=trust_pickles)
        seconds = {"total": sum(d.seconds.values()), **d.seconds}
        return Converted(src_dir, src_fmt, out_dir, fmt, workers, d.bytes_moved, seconds, d.summary())
    return _convert(src_dir, to, out_dir, load_state, src_fmt, fmt, workers, trust_pickles)


def _convert_megatron_dist(src_dir: str, to: str, out_dir: str, src_fmt: str, fmt: str, workers: int,
                           trust_pickles: bool) -> Converted:  # fmt: skip
    if src_fmt != fmt or "=" not in to or to.endswith(".json"):
        raise FormatError(f"Megatron torch_dist reshards into torch_dist, to a layout like tp=4,pp=1 (got {src_fmt} "
                          f"{src_dir} into {fmt}, {to!r}): args and keys come from the source")  # fmt: skip
    from tenplex.frameworks.megatron_dist.reshard import reshard_megatron_dist

    r = reshard_megatron_dist(src_dir, to, out_dir, workers, trust_pickles=trust_pickles)
    seconds = {"total": sum(r.seconds.values()), **r.seconds}
    return Converted(src_dir, src_fmt, out_dir, fmt, workers, r.bytes_moved, seconds, r.summary())


def _convert(src_dir: str, to: str, out_dir: str, load_state: Callable[[str], PTC], src_fmt: str, fmt: str,
             workers: int, trust_pickles: bool) -> Converted:  # fmt: skip
    from tenplex.frameworks.dcp.reshard import reshard_arrays

    start = time.perf_counter()
    src, arrays, values, meta = read(src_dir, src_fmt, trust_pickles=trust_pickles)
    dst = dst_ptc(src_fmt, src, meta, to, load_state)
    out_arrays, out_values, plan = reshard_arrays(src, arrays, values, dst, workers)
    _write(fmt, dst, dict(out_arrays), out_values, out_dir)
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    summary = (f"tenplex: resharded {src_fmt} {src_dir} into {fmt} {out_dir} with {workers} worker(s); "
               f"{moved} B moved between ranks, plan verified")  # fmt: skip
    return Converted(src_dir, src_fmt, out_dir, fmt, workers, moved, {"total": time.perf_counter() - start}, summary)


def _write(fmt: str, dst: PTC, arrays: dict, values: dict, out_dir: str) -> None:
    if fmt == "dcp":
        from tenplex.frameworks.dcp.write import write_dcp

        write_dcp(dst, arrays, values, out_dir)
    else:
        from tenplex.runtime.checkpoint.directory import write_checkpoint_dir

        write_checkpoint_dir(dst, arrays, values, Path(out_dir))


def inspect(path: str, *, trust_pickles: bool = False) -> list[str]:
    """Plain-words findings about a checkpoint directory of any format.

    Raises the format reader's error (a TenplexError naming the file) when the checkpoint
    cannot be read; findings that do not stop it from being read are lines of the result."""
    fmt, findings, ptc = inspect_report(path, trust_pickles=trust_pickles)
    if fmt != "tenplex":
        return findings
    from tenplex.compiler.emit.describe import describe

    return [*findings, *describe(ptc).splitlines()]


def inspect_report(path: str, *, trust_pickles: bool = False) -> tuple[str, list[str], PTC]:
    """(format, findings, the PTC of the layout) of a checkpoint directory; `inspect` prints
    the findings (and, for a tenplex directory, the PTC's description). Raises like `inspect`."""
    fmt = detect(path)
    if fmt == "structure":
        from tenplex.frameworks.structure.read import inspect_structure, read_structure

        return fmt, inspect_structure(path), read_structure(path)[0]
    if fmt == "megatron":
        from tenplex.frameworks.megatron.read import read_megatron
        from tenplex.frameworks.megatron.reshard import megatron_findings

        ckpt = read_megatron(path, trust_pickles=trust_pickles)
        return fmt, megatron_findings(ckpt), ckpt.ptc
    if fmt == "megatron-dist":
        from tenplex.frameworks.megatron_dist.describe import findings
        from tenplex.frameworks.megatron_dist.read import read_megatron_dist

        ckpt = read_megatron_dist(path, trust_pickles=trust_pickles)
        return fmt, findings(ckpt), ckpt.ptc
    if fmt == "dcp":
        from tenplex.frameworks.dcp.read import ptc_of_index, read_index
        from tenplex.frameworks.dcp.reshard import inspect_dcp

        index = read_index(path, trust_pickles=trust_pickles)  # once: a trusted pickle may do anything
        return fmt, inspect_dcp(path, index=index), ptc_of_index(index)
    from tenplex.runtime.checkpoint.directory import read_checkpoint

    return fmt, [f"tenplex checkpoint directory {path}"], read_checkpoint(path)[0]
