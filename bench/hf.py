"""`python -m bench --only hf,dcp-zstd [--quick]`: tenplex's safetensors and compressed-DCP readers
against the peers' own readers, in one process, on one machine, the two sides alternating.

`hf` (`run_hf`): a model of `LAYERS` bf16 [SIDE, SIDE] matrices (`--quick`: smaller) saved as
`save_pretrained` shards it (safetensors' own `save_file`, ~`SHARD` bytes per file, plus the
index), page cache warm. Rows, each `anchor s / tenplex s`:

- load a state dict: tenplex `read_hf` + a copy of each tensor into preallocated tensors, vs
  `dcp.load(state, storage_reader=HuggingFaceStorageReader(dir))` (DCP's HF path);
- open (memory-mapped): tenplex `read_hf` (numpy views of the mapped files), vs
  `safetensors.torch.load_file` of every shard (what `from_pretrained` does per shard; its
  tensors are views of mapped files too): neither reads tensor data yet;
- consolidate: `convert(dir, "whole", fmt="hf")` (read, compile a verified plan, copy, write
  `model.safetensors` with fsync), vs `load_file` of every shard + `save_file` + fsync.

`dcp-zstd` (`run_zstd`): the same tensors saved by `dcp.save` with torch's ZStandard
extension; `load_dcp` into preallocated tensors vs `dcp.load` of the same checkpoint.

Every figure: min / median / max over `REPEATS` runs of each side, and the ratio per run (the
two sides of one run are measured back to back, after an `os.sync()` each, so that neither
pays for the other's dirty pages); wall seconds, and the ratio of the process's CPU seconds
(all threads), which other jobs on a shared machine disturb less. Results: bench/results/{hf,dcp-zstd}.{md,json}.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import fmt_bytes, md_table, text_table, write_results

SIDE, LAYERS, SHARD = 2048, 64, 128 << 20  # 512 MiB of bf16 in 4 shards
QUICK = (256, 8, 256 << 10)
REPEATS = 3
HEADERS = ["row", "data", "anchor", "anchor s (min/med/max)", "tenplex s (min/med/max)", "anchor / tenplex (min/med/max)",
           "CPU s anchor / tenplex (min/med/max)", "equal"]  # fmt: skip


def _state(quick: bool) -> dict:
    import torch

    side, layers, _ = QUICK if quick else (SIDE, LAYERS, SHARD)
    g = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.weight": torch.randn(side, side, generator=g).to(torch.bfloat16) for i in range(layers)}


def _save_shards(state: dict, root: Path, shard: int) -> None:
    from safetensors.torch import save_file

    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(state):
        n = state[name].numel() * state[name].element_size()
        if groups[-1] and size + n > shard:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    files = [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    root.mkdir(parents=True)
    for f, names in zip(files, groups):
        save_file({k: state[k] for k in names}, str(root / f), metadata={"format": "pt"})
    weight_map = {k: f for f, names in zip(files, groups) for k in names}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _bits(t: Any) -> bytes:
    import torch

    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _into(state: dict, root: Path) -> None:
    """tenplex: `read_hf` and a copy of each tensor into `state`'s (preallocated) tensors."""
    import numpy as np
    import torch

    from tenplex.frameworks.hf.read import read_hf

    _, arrays, _ = read_hf(root)
    for name, t in state.items():
        np.copyto(t.view(torch.int16).numpy(), arrays[name].view(np.int16))


def _measure(name: str, data: int, anchor_name: str, anchor: Callable[[int], Any], tenplex: Callable[[int], Any],
             check: Callable[[], bool]) -> dict[str, Any]:  # fmt: skip
    """Both sides REPEATS times, alternating (anchor first on even runs); `check` after the last."""
    times: dict[str, list[float]] = {"anchor_s": [], "tenplex_s": [], "anchor_cpu_s": [], "tenplex_cpu_s": []}
    for i in range(REPEATS):
        order = (("anchor_s", anchor), ("tenplex_s", tenplex)) if i % 2 == 0 else (("tenplex_s", tenplex), ("anchor_s", anchor))
        for side, fn in order:
            os.sync()  # no side pays for the other's dirty pages
            start, cpu = time.perf_counter(), time.process_time()
            fn(i)
            times[side].append(time.perf_counter() - start)
            times[side.replace("_s", "_cpu_s")].append(time.process_time() - cpu)
    ratios = [a / t for a, t in zip(times["anchor_s"], times["tenplex_s"])]
    cpu_ratios = [a / max(t, 1e-9) for a, t in zip(times["anchor_cpu_s"], times["tenplex_cpu_s"])]
    row = {"name": name, "data_bytes": data, "anchor": anchor_name, "status": "ok", "equal": check(), **times, "ratios": ratios,
           "cpu_ratios": cpu_ratios}  # fmt: skip
    print(f"  {name}: anchor/tenplex median {statistics.median(ratios):.2f}x", file=sys.stderr, flush=True)
    return row


def _cells(r: dict[str, Any]) -> list[str]:
    def mmm(xs: list[float]) -> str:
        return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"

    return [r["name"], fmt_bytes(r["data_bytes"]), r["anchor"], mmm(r["anchor_s"]), mmm(r["tenplex_s"]),
            _ratio(r["ratios"]), _ratio(r["cpu_ratios"]), str(r["equal"])]  # fmt: skip


def _ratio(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}x"


def _same_files(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    return sorted(x) == sorted(y) and all(_bits(x[k]) == _bits(y[k]) for k in x)


def _hf_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    from tenplex.frameworks.formats import convert
    from tenplex.frameworks.hf.read import read_hf

    state = _state(quick)
    data = sum(t.numel() * t.element_size() for t in state.values())
    src = tmp / "src"
    _save_shards(state, src, QUICK[2] if quick else SHARD)
    shards = sorted(src.glob("*.safetensors"))
    mine, theirs = ({k: torch.empty_like(v) for k, v in state.items()} for _ in range(2))
    got: dict[str, Any] = {}

    def merged() -> dict:
        return {k: v for f in shards for k, v in load_file(str(f)).items()}

    def anchor_consolidate(i: int) -> None:
        (tmp / f"a{i}").mkdir()
        save_file(merged(), str(tmp / f"a{i}" / "model.safetensors"), metadata={"format": "pt"})
        with open(tmp / f"a{i}" / "model.safetensors", "rb+") as f:
            os.fsync(f.fileno())

    def no_spec(to: str) -> Any:
        raise AssertionError(to)

    rows = [
        _measure("load a state dict", data, "DCP HuggingFaceStorageReader",
                 lambda i: dcp.load(theirs, storage_reader=HuggingFaceStorageReader(str(src)), no_dist=True),
                 lambda i: _into(mine, src), lambda: all(_bits(mine[k]) == _bits(v) == _bits(theirs[k]) for k, v in state.items())),
        _measure("open (memory-mapped)", data, "safetensors.torch.load_file", lambda i: got.update(a=merged()),
                 lambda i: got.update(t=read_hf(src)[1]), lambda: all(got["t"][k].tobytes() == _bits(got["a"][k]) for k in state)),
        _measure("consolidate shards -> model.safetensors", data, "load_file + save_file + fsync", anchor_consolidate,
                 lambda i: convert(str(src), "whole", str(tmp / f"t{i}"), no_spec, fmt="hf"),
                 lambda: _same_files(tmp / "t0" / "model.safetensors", tmp / "a0" / "model.safetensors")),
    ]  # fmt: skip
    return rows


def _zstd_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard

    from tenplex.frameworks.dcp.load import load_dcp

    state = _state(quick)
    data = sum(t.numel() * t.element_size() for t in state.values())
    dcp.save(state, storage_writer=FileSystemWriter(str(tmp / "zstd"), _extensions=[ZStandard()]), no_dist=True)
    mine, theirs = ({k: torch.empty_like(v) for k, v in state.items()} for _ in range(2))
    return [_measure("read a zstd DCP checkpoint", data, "dcp.load (torch's reader)",
                     lambda i: dcp.load(theirs, checkpoint_id=str(tmp / "zstd"), no_dist=True),
                     lambda i: load_dcp(mine, tmp / "zstd", rank=0),
                     lambda: all(_bits(mine[k]) == _bits(v) == _bits(theirs[k]) for k, v in state.items()))]  # fmt: skip


def _run(stem: str, title: str, rows_of: Callable[[Path, bool], list[dict]], quick: bool, out_dir: Path,
         info: dict[str, Any]) -> tuple[list[dict], list[Path]]:  # fmt: skip
    import warnings

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{stem}-"))
    try:
        rows = rows_of(tmp, quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cells = [_cells(r) for r in rows]
    print(f"\n{title} (seconds min / median / max of {REPEATS}; ratio > 1: tenplex faster)")
    print(text_table(HEADERS, cells) + "\n", flush=True)
    machine = f"{info['date']}, git {info['git_rev'] or '?'}, {info['nproc']} CPUs ({info['cpu']})"
    md = "\n".join([f"# {title}", "", machine, "", md_table(HEADERS, cells), ""])
    return rows, write_results(out_dir, f"{stem}-quick" if quick else stem, {"machine": info, "rows": rows}, md)


def run_hf(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    return _run("hf", "Hugging Face safetensors: tenplex vs DCP's HF reader and safetensors", _hf_rows, quick, out_dir, info)


def run_zstd(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    return _run("dcp-zstd", "ZStandard-compressed DCP: tenplex load_dcp vs dcp.load", _zstd_rows, quick, out_dir, info)
