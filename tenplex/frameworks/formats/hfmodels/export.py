"""Consolidate a Megatron TP x PP checkpoint into a Hugging Face model directory that transformers loads.

`export_hf(src, out, arch, ...)` (`tenplex reshard SRC --from megatron --format hf --hf-arch llama`):

1. read SRC: a `torch_dist` checkpoint (`read_megatron_dist`; its layer stacks
   `decoder.layers.<name>` [L, ...] are cut per layer) or a legacy `mp_rank_*` tree
   (`read_megatron`; its tensors already carry tenplex's global names);
2. move the model tensors the map names (optimizer state and `_extra_state` stay behind) into
   one whole partition with a verified plan (`reshard_arrays`): the consolidation;
3. rename and re-lay them with the architecture's table (`hf.names.to_hf`: QKV de-interleaved
   per query group, SwiGLU fc1 split into gate and up, vocabulary padding removed), each tensor
   in its saved dtype;
4. write OUT with `write_hf` (`whole` or `max_shard_size=SIZE`, as `--to` says) and
   `config.json` from the saved args (`hf.config`): complete or absent.

Raises FormatError for a source that is not Megatron, the map's and config's `HfError`s naming
the file and field, and the readers' errors.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.formats.kinds import FormatError
from tenplex.frameworks.hf.config import llama_config, megatron_dims
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.names import ARCHS, Dims, map_names, megatron_name, to_hf
from tenplex.frameworks.hf.write import parse_target, whole_ptc, write_hf
from tenplex.ir.ptc import PTC, Allocation, Partition
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

__all__ = ["export_hf"]


def _source(src_dir: str, src_fmt: str, trust_pickles: bool) -> tuple[PTC, dict, dict, Any, str]:
    """(PTC, arrays, values, args, where the args are) of a Megatron source."""
    if src_fmt == "megatron-dist":
        from tenplex.frameworks.megatron_dist.read import read_megatron_dist

        ck = read_megatron_dist(src_dir, trust_pickles=trust_pickles)
        return ck.ptc, ck.arrays, ck.values, ck.common.get("args"), str(ck.where.step / "common.pt")
    if src_fmt == "megatron":
        from tenplex.frameworks.megatron.read import read_megatron

        ck = read_megatron(src_dir, trust_pickles=trust_pickles)
        return ck.ptc, ck.arrays, ck.values, ck.meta.args, f"{src_dir} (args of model_optim_rng.pt)"
    raise FormatError(f"--hf-arch maps Megatron checkpoints (--from megatron), not {src_fmt} {src_dir}")


def _global(ptc: PTC, src_fmt: str, arch: str, dims: Dims) -> dict[str, tuple[str, bool]]:
    """Source tensor name -> (tenplex global name, stacked) for the tensors the map takes (not
    the optimizer's)."""
    if src_fmt == "megatron-dist":
        return {t.name: g for t in ptc.tensors if (g := megatron_name(t.name)) is not None}
    known = {src for src, _ in map_names(arch, dims)}
    return {t.name: (t.name, False) for t in ptc.tensors if t.name in known}


def _legacy_vocab(ptc: PTC, dims: Dims, where: str) -> Dims:
    """The legacy reader strips the padding already: its vocabulary tensors hold the args' V rows."""
    rows = next(t.shape[0] for t in ptc.tensors if t.name == "embedding.word_embeddings.weight")
    if dims.vocab > rows:
        raise HfError(f"{where}: vocabulary {dims.vocab} (--hf-vocab) exceeds the checkpoint's {rows} rows")
    return attrs.evolve(dims, padded_vocab=rows)


def _consolidate(ptc: PTC, arrays: dict, values: dict, names: dict[str, tuple[str, bool]], layers: int,
                 workers: int) -> tuple[dict, int]:  # fmt: skip
    """(global name -> whole array, bytes the plan moved) of the named source tensors."""
    from tenplex.frameworks.dcp.reshard import reshard_arrays

    dst = whole_ptc(ptc, set(names))
    out, _, plan = reshard_arrays(ptc, arrays, values, dst, workers)
    whole: dict[str, np.ndarray] = {}
    for name, (global_name, stacked) in names.items():
        a = out[name]
        whole.update({global_name.format(i=i): a[i] for i in range(layers)} if stacked else {global_name: a})
    return whole, plan.stats.host_bytes + plan.stats.network_bytes


def _hf_ptc(tensors: dict[str, np.ndarray]) -> PTC:
    """One whole partition holding `tensors`, each in its array's dtype (the source's)."""
    metas = tuple(TensorMeta(name, a.shape, a.dtype.name) for name, a in sorted(tensors.items()))
    subs = tuple(
        SubTensor(t.name, t.name, t.name, t.shape, (Piece(t.box, t.box),) if t.box.volume else ()) for t in metas
    )
    part = Partition("model", [t.name for t in metas], {})
    return PTC(metas, subs, (part,), Allocation({"model": (0,)}), Topology((Device(0, "h0"),)))


def export_hf(src_dir: str, src_fmt: str, out_dir: str, arch: str, to: str = "whole", *, workers: int = 1,
              trust_pickles: bool = False, vocab: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the Megatron checkpoint SRC as a transformers `arch` model at OUT (see the module
    docstring); returns the facts of `Converted` (bytes moved, seconds, summary)."""
    start = time.perf_counter()
    if arch not in ARCHS:
        raise FormatError(f"--hf-arch {arch!r}: tenplex maps {', '.join(ARCHS)}")
    max_shard_bytes = parse_target(to)
    if Path(out_dir).exists():
        raise FormatError(f"{out_dir}: already exists (refusing to overwrite)")
    ptc, arrays, values, args, where = _source(src_dir, src_fmt, trust_pickles)
    dims = megatron_dims(args, where, vocab)
    config = llama_config(args, dims, where)
    if src_fmt == "megatron":
        dims = _legacy_vocab(ptc, dims, where)
    names = _global(ptc, src_fmt, arch, dims)
    whole, moved = _consolidate(ptc, arrays, values, names, dims.layers, workers)
    hf = to_hf(arch, dims, whole, src_dir)
    write_hf(_hf_ptc(hf), hf, {}, out_dir, max_shard_bytes, {"config.json": json.dumps(config, indent=2) + "\n"})
    summary = (f"tenplex: consolidated {src_fmt} {src_dir} into a Hugging Face {arch} "
               f"model {out_dir} ({len(hf)} tensors, {dims.layers} layers, vocabulary {dims.vocab} of {dims.padded_vocab}); "
               f"{moved} B moved between ranks, plan verified")  # fmt: skip
    return {"src": src_dir, "src_format": src_fmt, "out": out_dir, "out_format": "hf", "workers": workers,
            "bytes_moved": moved, "seconds": {"total": time.perf_counter() - start}, "summary": summary}  # fmt: skip
