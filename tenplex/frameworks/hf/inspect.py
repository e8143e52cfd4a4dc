"""`tenplex inspect` of a Hugging Face safetensors directory: what it holds, in plain words."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from tenplex.compiler.emit import human_bytes
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.names import ARCHS
from tenplex.frameworks.hf.read import INDEX, SHARDING, VALUES, HfIndex, ptc_of_index, read_index
from tenplex.ir.files import read_json

__all__ = ["inspect_hf"]


def inspect_hf(root: str | os.PathLike, index: HfIndex | None = None) -> list[str]:
    """Findings about a safetensors directory (`index`: its `read_index`, when done already):
    the files, tensors, dtypes, who wrote it, and how each tensor is stored. Reads headers only.

    Raises HfError when it cannot be read (see `read_index`, `ptc_of_index`)."""
    index = index or read_index(Path(root))
    ptc = ptc_of_index(index)
    dtypes = Counter(t.dtype for t in ptc.tensors)
    nbytes = sum(t.nbytes for t in ptc.tensors)
    named = f", named by {INDEX}" if index.indexed else ""
    out = [f"{index.root}: Hugging Face safetensors checkpoint, {len(index.headers)} file(s){named}, {len(ptc.tensors)} tensors "
           f"({human_bytes(nbytes)}; {', '.join(f'{n} {d}' for d, n in sorted(dtypes.items()))})"]  # fmt: skip
    if any(SHARDING in h.metadata for h in index.headers):
        cut = sum(1 for t in ptc.tensors if len(ptc.by_tensor[t.name]) > 1)
        out.append(f"written by PyTorch DCP's HuggingFaceStorageWriter ({SHARDING} in __metadata__ places each chunk); "
                   f"{cut} tensor(s) cut into chunks across files")  # fmt: skip
    for h in index.headers:
        if VALUES in h.metadata:
            out.append(f"{h.path.name}: non-tensor values from tenplex ({VALUES} in __metadata__)")
    for t in ptc.tensors:
        chunks = ptc.by_tensor[t.name]
        files = sorted({ptc.partition_of[st.id] for st in chunks})
        where = f"in {files[0]}" if len(chunks) == 1 else f"cut into {len(chunks)} chunks in {len(files)} files"
        out.append(f"tensor {t.name}: {t.dtype}{list(t.shape)} {where}")
    return out + _config(index.root, {t.name for t in ptc.tensors})


def _config(root: Path, names: set[str]) -> list[str]:
    """What `config.json` says (architecture and sizes), and whether the tensors are the ones
    tenplex's Megatron map (`hf.names`) writes for it."""
    path = root / "config.json"
    if not path.is_file():
        return []
    try:
        doc = read_json(path, HfError, "the model config")
    except HfError as e:
        return [f"config.json: unreadable ({e})"]
    if not isinstance(doc, dict):
        return ["config.json: not a JSON object"]
    archs = ", ".join(doc.get("architectures") or ["no architectures"])
    sizes = ", ".join(f"{k}={doc[k]}" for k in _SIZES if k in doc)
    out = [f"Hugging Face {doc.get('model_type', '?')} ({archs}) from config.json: {sizes}"]
    table = ARCHS.get(str(doc.get("model_type")))
    layers = doc.get("num_hidden_layers")
    if table is not None and type(layers) is int:
        want = {h.format(i=i) for row in table for i in range(layers) for h in row.hf}
        if want == names:
            out.append(f"tensors: exactly those of tenplex's Megatron <-> {doc['model_type']} map (tenplex reshard --hf-arch "
                       f"{doc['model_type']}; QKV per query group, SwiGLU fc1 as gate/up, vocabulary unpadded)")  # fmt: skip
    return out


_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "vocab_size", "dtype")  # fmt: skip
