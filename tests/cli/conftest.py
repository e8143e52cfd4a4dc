"""Fixtures for the CLI tests: small hand-built PTC JSON files (two hosts, padding, values); the
`tenplex(...)` call is in tests/conftest.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

DEVICES = [{"id": i, "host": f"h{i // 2}"} for i in range(4)]  # h0: 0, 1; h1: 2, 3
TENSORS = {"w": {"shape": [8, 4], "dtype": "float32"}, "emb": {"shape": [7, 4], "dtype": "float16"}}


def rows(tensor: str, start: int, stop: int, cols: int = 4) -> dict:
    return {"tensor": tensor, "path": f"model/{tensor}", "box": [[start, stop], [0, cols]]}


def padded(tensor: str, start: int, stop: int, local_rows: int, cols: int = 4) -> dict:
    """Rows [start, stop) at the top of a [local_rows, cols] array; the rest is fill."""
    piece = {"global": [[start, stop], [0, cols]], "local": [[0, stop - start], [0, cols]]}
    return {"tensor": tensor, "path": f"model/{tensor}", "shape": [local_rows, cols], "pieces": [piece]}


def ptc_doc(layout: dict[str, tuple[list[int], dict[str, dict]]], tensors: dict | None = None) -> dict:
    """layout: partition id -> (devices, {sub-tensor id: sub-tensor JSON})."""
    return {
        "format": "tenplex.ptc/1",
        "devices": copy.deepcopy(DEVICES),
        "tensors": copy.deepcopy(tensors or TENSORS),
        "subtensors": {sid: st for _, subs in layout.values() for sid, st in subs.items()},
        "partitions": {
            pid: {"subtensors": sorted(subs), "values": {"iteration": {"value": 7}}}
            for pid, (_, subs) in layout.items()
        },
        "allocation": {pid: devs for pid, (devs, _) in layout.items()},
    }


def src_doc() -> dict:
    """tp2 on host h0; host h1 holds nothing yet."""
    return ptc_doc({
        "tp0": ([0], {"w/tp0": rows("w", 0, 4), "emb/tp0": rows("emb", 0, 4)}),
        "tp1": ([1], {"w/tp1": rows("w", 4, 8), "emb/tp1": rows("emb", 4, 7)}),
    })  # fmt: skip


def dst_doc() -> dict:
    """tp4 over both hosts; the embedding is padded to 2 rows per rank (vocabulary padding)."""
    layout = {}
    for k in range(4):
        emb = padded("emb", 2 * k, min(2 * k + 2, 7), 2)
        layout[f"tp{k}"] = ([k], {f"w/tp{k}": rows("w", 2 * k, 2 * k + 2), f"emb/tp{k}": emb})
    return ptc_doc(layout)


def write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc, indent=1))
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "src": write(tmp_path / "src.json", src_doc()),
        "dst": write(tmp_path / "dst.json", dst_doc()),
        "dir": str(tmp_path),
    }
