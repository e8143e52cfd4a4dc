"""`convert`: read a checkpoint, move it into another layout with a verified plan, write it in a format."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.formats.kinds import FormatError, detect
from tenplex.ir.ptc import PTC


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


def read(path: str | os.PathLike, fmt: str, *, trust_pickles: bool = False) -> tuple[PTC, dict, dict, Any]:
    """(PTC, sub-tensor id -> array, partition id -> values, format metadata or None)."""
    if fmt == "megatron":
        from tenplex.frameworks.megatron.read import read_megatron

        ckpt = read_megatron(path, trust_pickles=trust_pickles)
        return ckpt.ptc, ckpt.arrays, ckpt.values, ckpt.meta
    if fmt == "dcp":
        from tenplex.frameworks.dcp.read import read_dcp

        return (*read_dcp(path, trust_pickles=trust_pickles), None)
    if fmt == "deepspeed":
        from tenplex.frameworks.deepspeed.read import read_deepspeed

        return read_deepspeed(path, trust_pickles=trust_pickles)
    if fmt == "hf":
        from tenplex.frameworks.hf.read import read_hf

        return (*read_hf(path), None)
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
    if fmt == "deepspeed" and to.startswith(("dp=", "tp=", "pp=")):
        from tenplex.frameworks.deepspeed.reshard import dst_ptc as deepspeed_ptc

        return deepspeed_ptc(meta, to)
    if fmt in ("dcp", "hf") and _is_mesh_layout(to):
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
            fmt: str | None = None, workers: int = 1, trust_pickles: bool = False, hf_arch: str | None = None,
            hf_vocab: int | None = None) -> Converted:  # fmt: skip
    """Reshard SRC into `to` and write OUT in `fmt`; returns what was done (`Converted`).
    `trust_pickles`: see the module docstring. `hf_arch` (with `fmt` hf and a Megatron source):
    write a transformers model of that architecture (`hfmodels.export`; `hf_vocab`: the true vocabulary);
    with an hf source and `fmt` megatron-dist, a Megatron torch_dist tree of it (`hfmodels.start`).

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
    if hf_arch is not None:
        return _export_hf(src_dir, to, out_dir, src_fmt, fmt, workers, trust_pickles, hf_arch, hf_vocab)
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
    if fmt == "deepspeed":
        if src_fmt != "deepspeed" or not to.startswith(("dp=", "tp=", "pp=")):
            raise FormatError(f"DeepSpeed output needs a DeepSpeed source and a layout like dp=4 (got {src_fmt} {src_dir} "
                              f"and {to!r}): parameter groups and optimizer settings come from the source")  # fmt: skip
        from tenplex.frameworks.deepspeed.reshard import reshard_deepspeed

        r = reshard_deepspeed(src_dir, to, out_dir, workers, trust_pickles=trust_pickles)
        seconds = {"total": sum(r.seconds.values()), **r.seconds}
        return Converted(src_dir, src_fmt, out_dir, fmt, workers, r.bytes_moved, seconds, r.summary())
    if fmt == src_fmt == "dcp" and _is_mesh_layout(to):
        from tenplex.frameworks.dcp.reshard import reshard_dcp

        d = reshard_dcp(src_dir, to, out_dir, workers, trust_pickles=trust_pickles)
        seconds = {"total": sum(d.seconds.values()), **d.seconds}
        return Converted(src_dir, src_fmt, out_dir, fmt, workers, d.bytes_moved, seconds, d.summary())
    return _convert(src_dir, to, out_dir, load_state, src_fmt, fmt, workers, trust_pickles)


def _export_hf(src_dir: str, to: str, out_dir: str, src_fmt: str, fmt: str, workers: int, trust_pickles: bool,
               arch: str, vocab: int | None) -> Converted:  # fmt: skip
    if src_fmt == "hf" and fmt == "megatron-dist":
        from tenplex.frameworks.formats.hfmodels.start import import_hf

        return Converted(**import_hf(src_dir, out_dir, arch, to, workers=workers))
    if fmt != "hf":
        raise FormatError(f"--hf-arch {arch} names a Hugging Face architecture: it needs --format hf, or --from hf "
                          f"--format megatron-dist (got {src_fmt} into {fmt})")  # fmt: skip
    from tenplex.frameworks.formats.hfmodels.export import export_hf

    done = export_hf(src_dir, src_fmt, out_dir, arch, to, workers=workers, trust_pickles=trust_pickles, vocab=vocab)
    return Converted(**done)


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
    direct = None
    if fmt == "hf":
        from tenplex.frameworks.hf.write import parse_target, whole_arrays, whole_ptc

        max_shard_bytes, dst, direct = parse_target(to), whole_ptc(src), whole_arrays(src, arrays)
    else:
        max_shard_bytes, dst = None, dst_ptc(src_fmt, src, meta, to, load_state)
    stream = fmt == "hf" and workers == 1  # write_hf takes each array once: no second copy of the state
    out_arrays, out_values, plan = reshard_arrays(src, arrays, values, dst, workers, stream=stream)
    out_arrays = direct if stream and direct is not None else out_arrays  # the plan copies each whole: write src's
    _write(fmt, dst, out_arrays if stream else dict(out_arrays), out_values, out_dir, max_shard_bytes)
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    summary = (f"tenplex: resharded {src_fmt} {src_dir} into {fmt} {out_dir} with {workers} worker(s); "
               f"{moved} B moved between ranks, plan verified")  # fmt: skip
    return Converted(src_dir, src_fmt, out_dir, fmt, workers, moved, {"total": time.perf_counter() - start}, summary)


def _write(fmt: str, dst: PTC, arrays: Mapping, values: dict, out_dir: str, max_shard_bytes: int | None) -> None:
    if fmt == "hf":
        from tenplex.frameworks.hf.write import write_hf

        write_hf(dst, arrays, values, out_dir, max_shard_bytes)
    elif fmt == "dcp":
        from tenplex.frameworks.dcp.write import write_dcp

        write_dcp(dst, arrays, values, out_dir)
    else:
        from tenplex.runtime.checkpoint.directory import write_checkpoint_dir

        write_checkpoint_dir(dst, arrays, values, Path(out_dir))
