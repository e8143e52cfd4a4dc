"""Framework adapters: read and write the checkpoints of training frameworks (DTensor/DCP, Megatron) as PTCs.

Names resolve lazily, so importing the package imports neither torch nor an adapter."""

from __future__ import annotations

import importlib
from typing import Any

_MEGATRON = {
    "CheckpointFormatError": "megatron_files", "read_megatron": "megatron_read", "write_megatron": "megatron_write",
    "reshard_megatron": "megatron_reshard", "inspect_megatron": "megatron_reshard", "parse_layout": "megatron_args",
}  # fmt: skip
_DCP = {
    "read_dcp": "dcp_read", "write_dcp": "dcp_write", "reshard_dcp": "dcp_reshard", "inspect_dcp": "dcp_reshard",
    "load_dcp": "dcp_load", "DcpError": "dcp_format", "ptc_from_state_dicts": "dtensor", "state_dicts_from_arrays": "dtensor",
}  # fmt: skip
_STRUCTURE = {"read_structure": "structure", "write_structure": "structure", "inspect_structure": "structure",
              "StructureError": "structure"}  # fmt: skip
_NAMES = {**_MEGATRON, **_DCP, **_STRUCTURE}


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
