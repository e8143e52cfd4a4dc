"""Plain-words findings about a DCP checkpoint directory (`tenplex inspect`), without torch:
they come from `.metadata` (`dcp.index`) and the data files' sizes."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from tenplex.compiler.emit import human_bytes
from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dcp.index import DcpIndex, ptc_of_index, read_index
from tenplex.frameworks.dcp.transforms import describe_transforms
from tenplex.ir.files import check_regular, confined
from tenplex.ir.ptc import PTC

__all__ = ["inspect_dcp"]


def inspect_dcp(root: str | os.PathLike, *, trust_pickles: bool = False, index: DcpIndex | None = None) -> list[str]:
    """Plain-words findings about a DCP directory: what it holds and how each tensor is cut.
    Reads `.metadata` (unless `index` is its `read_index` already) and file sizes only
    (`trust_pickles`: see `read_index`).

    Raises:
        DcpError: a problem visible without reading tensor data (unreadable metadata, chunks
            that overlap or leave a gap, missing, short or non-regular data files): a checkpoint
            that cannot be read is not described as if it could. The message lists every
            missing or short file."""
    root = Path(root)
    index = index or read_index(root, trust_pickles=trust_pickles)
    ptc = ptc_of_index(index)
    problems = _file_problems(index)
    if problems:
        raise DcpError(f"{root}: {len(problems)} data file(s) cannot be read: {'; '.join(problems)}")
    out = [_overview(index)]
    out += [_tensor_line(ptc, meta.name) for meta in ptc.tensors]
    out += _value_lines(index) + describe_transforms(list(index.entries))
    return out + ["all data files are present and long enough for their entries"]


def _overview(index: DcpIndex) -> str:
    nbytes = sum(t.nbytes for t in index.tensors)
    n_bytes = sum(1 for e in index.entries if e.box is None)
    return (f"{index.root}: DCP checkpoint (format version {index.version or 'unknown'}), {len(index.files)} data files, "
            f"{len(index.tensors)} tensors ({human_bytes(nbytes)} of tensor data), {n_bytes} bytes entries (non-tensor values)")  # fmt: skip


def _tensor_line(ptc: PTC, name: str) -> str:
    meta = ptc.tensor_map[name]
    subs = ptc.by_tensor[name]
    boxes = [p.global_box for st in subs for p in st.pieces]
    cut = [d for d in range(len(meta.shape)) if len({(b.start[d], b.stop[d]) for b in boxes}) > 1]
    how = f"cut along dim(s) {cut}" if cut else "one whole chunk (replicated or unsharded)"
    empty = sum(1 for st in subs if not st.pieces)
    extra = f", {empty} empty chunk(s) (zero-size shards)" if empty else ""
    files = {ptc.partition_of[st.id] for st in subs}
    return f"tensor {name}: {meta.dtype}{list(meta.shape)}, {len(subs)} chunk(s) in {len(files)} file(s), {how}{extra}"


def _value_lines(index: DcpIndex) -> list[str]:
    names = [e.fqn for e in index.entries if e.box is None]
    if not names:
        return []
    return [f"{len(names)} bytes entries ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): read as JSON values "
            "when torch.load(weights_only=True) gives JSON data, else kept as opaque torch.save bytes and written back unchanged"]  # fmt: skip


def _file_problems(index: DcpIndex) -> list[str]:
    out = []
    need: Counter[str] = Counter()
    for e in index.entries:
        need[e.file] = max(need[e.file], e.offset + e.length)
    for file, end in sorted(need.items()):
        path = index.root / file
        try:
            confined(index.root, file, "data file", DcpError)
            check_regular(path, f"needed up to byte {end}", DcpError)
        except DcpError as e:
            out.append(str(e))
            continue
        if path.stat().st_size < end:
            out.append(f"{path}: truncated: has {path.stat().st_size} bytes, entries need {end}")
    return out
