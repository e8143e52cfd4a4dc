"""Package exports that import their module on first use (PEP 562).

A package whose modules pull in torch, ucxx, mfusepy or aiohttp names its API with `lazy` so
that `import tenplex.<package>` (and the `tenplex` command's start-up) costs nothing until a
name is used:

    __getattr__, __all__ = lazy(__name__, {"read_dcp": "read", "DcpError": "format"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """(`__getattr__`, `__all__`) for `package`: name -> the submodule (relative) that defines it."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(where)
