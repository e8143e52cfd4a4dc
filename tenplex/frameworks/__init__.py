"""Framework adapters: read and write the checkpoints of training frameworks (DTensor/DCP, Megatron) as PTCs.

Names resolve lazily, so importing the package imports neither torch nor an adapter."""

from __future__ import annotations

import importlib
from typing import Any

_MEGATRON = {
    "CheckpointFormatError": "megatron_files", "read_megatron": "megatron_read", "write_megatron": "megatron_write",
    "reshard_megatron": "megatron_reshard", "inspect_megatron": "megatron_reshard", "parse_layout": "megatron_args",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _MEGATRON:
        return getattr(importlib.import_module(f"{__name__}.{_MEGATRON[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
