"""Elastic jobs (DESIGN.md section 8): a controller that reacts to resource changes by choosing a
new parallel configuration, stopping the program at a step boundary, resharding its saved state
and relaunching it; `Job` is what the training program calls (`tenplex.elastic.api`)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("Job", "ParallelConfig"):
        from tenplex.elastic import api

        return getattr(api, name)
    raise AttributeError(f"module 'tenplex.elastic' has no attribute {name!r}")
