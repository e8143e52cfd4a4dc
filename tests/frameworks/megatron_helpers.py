"""Test helpers for the Megatron adapter: logical tensors of a triple, in-process resharding through
the compiler and executor, and structural comparison of checkpoint trees."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tenplex.compiler import compile_plan
from tenplex.frameworks.megatron.meta import MegatronCheckpoint, cluster_for
from tenplex.frameworks.megatron.reshard import target_layout
from tenplex.frontends.transformer import build_ptc
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import np_dtype, piece_view, view
from tenplex.runtime.executor import Executor, State
from tenplex.runtime.reshard import rehome
from tenplex.runtime.transport.local import LocalTransport


def logical(ptc: PTC, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor merged from its sub-tensors (fill stripped); asserts that replicas agree."""
    out = {t.name: np.full(t.shape, np.nan, dtype=np.float64) for t in ptc.tensors}
    for st in ptc.subtensors:
        for piece in st.pieces:
            got = piece_view(arrays[st.id], piece).astype(np.float64)
            region = view(out[st.tensor], piece.global_box)
            seen = ~np.isnan(region)
            assert np.array_equal(region[seen], got[seen]), f"replicas of {st.tensor} disagree at {st.id}"
            region[...] = got
    for name, full in out.items():
        assert not np.isnan(full).any(), f"tensor {name} is not fully covered"
    return {t.name: out[t.name].astype(np_dtype(t.dtype)) for t in ptc.tensors}


def assert_truth(ptc: PTC, arrays: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> None:
    """Every logical tensor equals the builder's full tensor, bit for bit."""
    got = logical(ptc, arrays)
    for name, full in got.items():
        want = truth[name]
        assert full.shape == want.shape, (name, full.shape, want.shape)
        assert full.tobytes() == np.ascontiguousarray(want).astype(full.dtype).tobytes(), name


def reshard(src: MegatronCheckpoint, to: Any) -> tuple[PTC, dict, dict, Any]:
    """(dst PTC, arrays, values, meta) after compiling and executing src -> `to` in-process."""
    parallel = target_layout(src.meta, to)
    dst = build_ptc(src.meta.model, parallel, cluster_for(parallel))
    src_h, dst_h = rehome(src.ptc, dst, 1)
    plan = compile_plan(src_h, dst_h)
    home = {p.id: src_h.allocation.devices_of(p.id)[0] for p in src_h.partitions}
    state = State({(sid, home[src_h.partition_of[sid]]): a for sid, a in src.arrays.items()},
                  {(pid, home[pid]): v for pid, v in src.values.items()})  # fmt: skip
    out = Executor(plan, src_h, dst_h, LocalTransport()).run(state)
    placed = dst_h.with_allocation(plan.allocation)
    first = {p.id: placed.allocation.devices_of(p.id)[0] for p in placed.partitions}
    arrays = {st.id: out.arrays[(st.id, first[placed.partition_of[st.id]])] for st in placed.subtensors}
    values = {pid: out.values.get((pid, d), {}) for pid, d in first.items()}
    return dst, arrays, values, src.meta.with_layout(parallel)


def load_tree(root: Path) -> dict[str, Any]:
    """{relative path: loaded object} of every file of a checkpoint tree."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = str(path.relative_to(root))
            out[rel] = path.read_text() if path.suffix == ".txt" else torch.load(path, weights_only=False)
    return out


def diff(a: Any, b: Any, where: str = "", skip: tuple[str, ...] = ("rng_state",)) -> list[str]:
    """Paths where two loaded objects differ (tensors by dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)))  # fmt: skip
        return [] if same else [where]
    if isinstance(a, argparse.Namespace) and isinstance(b, argparse.Namespace):
        return diff(vars(a), vars(b), where + ".args", skip)
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{where}: keys {list(a)} vs {list(b)}"]
        return [d for k in a if k not in skip for d in diff(a[k], b[k], f"{where}/{k}", skip)]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b) or type(a) is not type(b):
            return [f"{where}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}[{len(b)}]"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{where}/{i}", skip)]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) else [where]
    return [] if (type(a) is type(b) and a == b) else [f"{where}: {a!r} vs {b!r}"]
