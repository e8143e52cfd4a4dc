"""`tenplex inspect` of a Megatron `torch_dist` checkpoint: plain-words findings.

What it is (tree or bare, iteration), the layout it was saved under and where that was read
from, its model and optimizer tensors and how they are cut (per-layer chunks, the TP cut), its
sharded objects, its files, whether `tenplex reshard` can move its optimizer state across
tp and pp, and whether `--hf-arch llama` maps it to a Hugging Face model (or what stops it).
"""

from __future__ import annotations

import os
from collections import Counter

from tenplex.frameworks.hf.config import llama_config, megatron_dims
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.megatron_dist.layout import grid, model_key, tp_axis
from tenplex.frameworks.megatron_dist.read import DistCheckpoint, read_megatron_dist


def inspect_megatron_dist(path: str | os.PathLike, *, trust_pickles: bool = False) -> list[str]:
    """Findings about the checkpoint at `path`. Raises as `read_megatron_dist`."""
    return findings(read_megatron_dist(path, trust_pickles=trust_pickles))


def findings(ckpt: DistCheckpoint) -> list[str]:
    where = ckpt.where
    iteration = ckpt.common.get("iteration")
    what = f"Megatron-LM tree {where.root}, step {where.step.name}" if where.root else f"dist_checkpointing directory {where.step}"
    lines = [f"Megatron torch_dist checkpoint: {what}" + (f", iteration {iteration}" if isinstance(iteration, int) else "")]
    lines.append(f"saved under {ckpt.layout} (from {ckpt.origin})")
    tensors = ckpt.ptc.tensors
    model = [t for t in tensors if model_key(t.name) == t.name and not t.name.startswith("optimizer.")]
    size = sum(t.nbytes for t in tensors)
    lines.append(f"{len(tensors)} tensors ({len(model)} model, {len(tensors) - len(model)} optimizer), {size} B")
    optimizer = {"dp_reshardable": "distributed optimizer, dp_reshardable (flat bucket buffers): tenplex reshards it across dp only",
                 "model space": "model space (non-distributed optimizer or fully_reshardable): resharded with its parameters",
                 None: "none"}[ckpt.optimizer]  # fmt: skip
    lines.append(f"optimizer state: {optimizer}")
    content = ckpt.common.get("content_metadata")
    if isinstance(content, dict) and content:
        lines.append("content metadata: " + ", ".join(f"{k}={v!r}" for k, v in sorted(content.items())))
    for t in model:
        cuts = grid(t.name, t.shape, [p.global_box for st in ckpt.ptc.by_tensor[t.name] for p in st.pieces])
        axis = tp_axis(t.name, len(t.shape))
        how = [f"{len(c) - 1} along axis {a}" + (" (tensor parallel)" if a == axis else "")
               for a, c in enumerate(cuts) if len(c) > 2]  # fmt: skip
        lines.append(f"  {t.name} {t.dtype}{list(t.shape)}: " + ("cut " + ", ".join(how) if how else "one chunk"))
    objects = Counter(name.split("/shard_")[0] for values in ckpt.values.values() for name in values)
    if objects:
        lines.append("sharded objects: " + ", ".join(f"{k} ({n})" for k, n in sorted(objects.items())))
    lines.append(f"files: {len(ckpt.ptc.partitions)} data files, common.pt, metadata.json "
                 f"(sharded_backend {ckpt.config.get('sharded_backend')!r})")  # fmt: skip
    return lines + _hf(ckpt)


def _hf(ckpt: DistCheckpoint) -> list[str]:
    """Whether the args describe a model tenplex maps to a Hugging Face architecture, and why not."""
    args = ckpt.common.get("args")
    try:
        llama_config(args, megatron_dims(args, "common.pt"), "common.pt")
    except HfError as e:
        return [f"Hugging Face: no --hf-arch map ({str(e).removeprefix('common.pt: ').split(';')[0]})"]
    return ["Hugging Face: a Llama (LlamaForCausalLM); tenplex reshard --format hf --hf-arch llama maps its names "
            "(QKV per query group to q/k/v_proj, SwiGLU fc1 to gate/up_proj, vocabulary unpadded)"]  # fmt: skip
