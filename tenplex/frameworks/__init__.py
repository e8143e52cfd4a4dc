"""Framework adapters: read and write the checkpoints of training frameworks (DTensor/DCP, Megatron) as PTCs.

Names resolve lazily, so importing the package imports neither torch nor an adapter."""

from __future__ import annotations

import importlib
from typing import Any

_MEGATRON = {
    "CheckpointFormatError": "megatron.tree", "read_megatron": "megatron.read", "write_megatron": "megatron.write",
    "reshard_megatron": "megatron.reshard", "inspect_megatron": "megatron.reshard", "parse_layout": "megatron.args",
}  # fmt: skip
_DCP = {
    "read_dcp": "dcp.read", "write_dcp": "dcp.write", "reshard_dcp": "dcp.reshard", "inspect_dcp": "dcp.reshard",
    "load_dcp": "dcp.load", "DcpError": "dcp.format", "ptc_from_state_dicts": "dtensor.state", "state_dicts_from_arrays": "dtensor.state",
}  # fmt: skip
_STRUCTURE = {"read_structure": "structure.read", "write_structure": "structure.read", "inspect_structure": "structure.read",
              "StructureError": "structure.read"}  # fmt: skip
_NAMES = {**_MEGATRON, **_DCP, **_STRUCTURE}


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
