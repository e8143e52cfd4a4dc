"""Start a Megatron TP x PP job from a Hugging Face model: a `torch_dist` checkpoint megatron-core loads.

`import_hf(src, out, arch, "tp=T,pp=P[,dp=D]")` (`tenplex reshard HF_DIR --format megatron-dist
--hf-arch llama --to tp=2,pp=2 --out OUT`):

1. read SRC (`read_hf`) and its `config.json`; the args a Megatron-LM job of that model would
   save (`hf.config.megatron_args`: the vocabulary padded to a multiple of 128·T);
2. the whole tensors under Megatron's names and layouts (`hf.names.from_hf`: QKV fused per query
   group, fc1 = [gate; up], vocabulary padded with zeros), as a source PTC cut the way a tp=1,
   pp=1 megatron-core save is (`torch_dist` keys; a layer stack `[L, ...]` one chunk per layer;
   fc1 in its W and V halves);
3. the target cut as megatron-core cuts a save under T x P x D (`megatron_dist.layout.dst_ptc`),
   a verified plan (`reshard_arrays`), DCP's writer; `common.pt` (args, iteration 0,
   checkpoint_version 3.0), `metadata.json` and the `_extra_state` objects of megatron-core's
   local-spec layers, in a Megatron-LM tree (`release/` and its tracker). No optimizer state
   and no RNG state: load it as Megatron-LM loads a converted model (`--finetune`,
   `--no-load-optim --no-load-rng`).

OUT is complete or absent. Raises `HfError` naming the file and field (config, map), FormatError.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.dcp.reshard import reshard_arrays
from tenplex.frameworks.dcp.write import write_dcp
from tenplex.frameworks.formats.kinds import FormatError
from tenplex.frameworks.hf.config import megatron_args, megatron_dims
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.names import ARCHS, dist_key, from_hf
from tenplex.frameworks.hf.read import read_hf
from tenplex.frameworks.hf.write import whole_arrays, whole_ptc
from tenplex.frameworks.megatron.tree import atomic_dir
from tenplex.frameworks.megatron_dist.files import write_side_files, write_tracker
from tenplex.frameworks.megatron_dist.layout import Layout, dst_ptc
from tenplex.frameworks.megatron_dist.reshard import target_layout
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

__all__ = ["import_hf"]

STEP = "release"
CONFIG = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
EXTRA = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")  # local spec


def _whole_hf(src_dir: str, workers: int) -> dict[str, np.ndarray]:
    """Transformers tensor name -> whole array of a safetensors directory."""
    ptc, arrays, values = read_hf(src_dir)
    direct = whole_arrays(ptc, arrays)
    if direct is not None:
        return direct
    out, _, _ = reshard_arrays(ptc, arrays, values, whole_ptc(ptc), workers)
    return {t.name: out[t.name] for t in ptc.tensors}


def _source(tensors: dict[str, np.ndarray], layers: int) -> tuple[PTC, dict[str, np.ndarray]]:
    """A one-rank PTC of the `torch_dist` keys, cut as a tp=1, pp=1 save: layer stacks per layer,
    fc1 in halves; its arrays are the global tensors' (views, no copy)."""
    metas: dict[str, TensorMeta] = {}
    subs: list[SubTensor] = []
    arrays: dict[str, np.ndarray] = {}
    for name, a in sorted(tensors.items()):
        key, layer = dist_key(name)
        shape = a.shape if layer is None else (layers, *a.shape)
        metas[key] = TensorMeta(key, shape, a.dtype.name)
        lead = () if layer is None else (layer,)
        halves = 2 if key.endswith("linear_fc1.weight") else 1
        for h, part in enumerate(np.split(a, halves)):
            start = (*lead, h * part.shape[0], *(0,) * (part.ndim - 1))
            box = Box(start, tuple(s + n for s, n in zip(start, (1,) * len(lead) + part.shape)))
            sid = f"{key}@[{','.join(map(str, start))}]"
            subs.append(SubTensor(sid, key, sid, box.shape, (Piece(box, Box.from_shape(box.shape)),)))
            arrays[sid] = part.reshape(box.shape)
    part = Partition("rank0", [st.id for st in subs], {})
    return PTC(
        tuple(metas.values()), tuple(subs), (part,), Allocation({"rank0": (0,)}), Topology((Device(0, "h0"),))
    ), arrays


def _extra_states(layers: int) -> dict[str, Any]:
    """The `_extra_state` sharded objects megatron-core's local-spec layers save (None each)."""
    return {f"decoder.layers.{m}._extra_state/shard_{i}_{layers}": [None] for m in EXTRA for i in range(layers)}


def _config(src_dir: str) -> dict[str, Any]:
    path = Path(src_dir) / "config.json"
    if not path.is_file():
        raise HfError(f"{path}: missing: --hf-arch needs the model's config.json beside its safetensors files")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HfError(f"{path}: not a JSON object ({e})") from None
    if not isinstance(doc, dict):
        raise HfError(f"{path}: not a JSON object")
    return doc


def import_hf(src_dir: str, out_dir: str, arch: str, to: str, *, workers: int = 1) -> dict[str, Any]:
    """Write the transformers `arch` model SRC as a Megatron `torch_dist` tree at OUT under the
    layout `to` (see the module docstring); returns the facts of `Converted`."""
    start = time.perf_counter()
    if arch not in ARCHS:
        raise FormatError(f"--hf-arch {arch!r}: tenplex maps {', '.join(ARCHS)}")
    if Path(out_dir).exists():
        raise FormatError(f"{out_dir}: already exists (refusing to overwrite)")
    layout = target_layout(Layout(1, 1, 1), to)
    where = str(Path(src_dir) / "config.json")
    args = megatron_args(_config(src_dir), layout.tp, layout.pp, layout.dp, where)
    dims = megatron_dims(args, where)
    src, arrays = _source(from_hf(arch, dims, _whole_hf(src_dir, workers), src_dir), dims.layers)
    values = _extra_states(dims.layers)
    dst = dst_ptc(src, Layout(1, 1, 1), layout, {name: Value() for name in values})
    bare = PTC(dst.tensors, dst.subtensors, tuple(attrs.evolve(p, values=()) for p in dst.partitions), dst.allocation,
               dst.topology)  # fmt: skip
    out, _, plan = reshard_arrays(src, arrays, {}, bare, workers, stream=workers == 1)
    with atomic_dir(Path(out_dir)) as tmp:
        write_dcp(dst, out, {"rank0": values}, tmp / STEP)
        write_side_files(tmp / STEP, CONFIG, {"args": args, "iteration": 0, "checkpoint_version": 3.0})
        write_tracker(tmp, STEP)
    moved = plan.stats.host_bytes + plan.stats.network_bytes
    summary = (f"tenplex: wrote the Hugging Face {arch} model {src_dir} as a Megatron torch_dist tree {out_dir} "
               f"({layout}; vocabulary {dims.vocab} padded to {dims.padded_vocab}); {moved} B moved between ranks, plan verified")  # fmt: skip
    return {"src": src_dir, "src_format": "hf", "out": out_dir, "out_format": "megatron-dist", "workers": workers,
            "bytes_moved": moved, "seconds": {"total": time.perf_counter() - start}, "summary": summary}  # fmt: skip
