"""`load(path)`: rebuild the state `save` wrote (`checkpoint.manifest` describes the format).

A save may come from anyone, so loading trusts nothing in it: no module is ever imported (a
namedtuple's class is used only if its module is already imported and its fields match; else a
look-alike namedtuple is built), every `file` is a relative path without `.`/`..`/empty parts
that resolves inside the save, only regular files are opened, and a `.npy` header must fit its
file before anything is allocated (`tenplex.ir.files`, `checkpoint.npy`).

Invariants: load(save(x)) equals x exactly (container types, key types and order, dtypes, shapes,
bytes, requires_grad and device, or `map_location`); a missing, corrupt or misplaced file, or a
manifest node that does not match its file, raises `SerdeError` naming the manifest or the file.
torch is imported only when the state holds tensors.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tenplex.ir.files import confined, one_line, read_json
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.manifest import FORMAT, MANIFEST, RAW, VERSION, SerdeError, decode_float
from tenplex.runtime.checkpoint.npy import as_dtype, load_npy

__all__ = ["load"]


def load(path: str | os.PathLike, *, map_location: Any = None) -> Any:
    """Rebuild the state saved at `path`. Torch tensors go to `map_location` (a device or its
    name) or, if None, to the device they were saved from; torch is imported only if needed.

    Raises:
        SerdeError: `path` is not a tenplex save, or a file is missing, corrupt or does not
            match the manifest (names the file).
    """
    path = Path(path)
    try:
        doc = read_json(path / MANIFEST, _FileError, "the manifest of a tenplex save")
    except _FileError as e:
        raise SerdeError(f"cannot read manifest of {str(path)!r}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise SerdeError(f"{str(path / MANIFEST)!r} is not a {FORMAT} v{VERSION} manifest")
    try:
        return _Reader(path, map_location).node(doc.get("root"), "state")
    except RecursionError:
        raise SerdeError(f"{str(path / MANIFEST)!r}: nodes nested too deeply") from None


class _FileError(SerdeError):
    """A file of the save that cannot be opened; rewrapped with the manifest's context."""


class _Reader:
    def __init__(self, root: Path, map_location: Any):
        self.root, self.map_location, self.memo = root, map_location, {}

    def node(self, node: Any, where: str) -> Any:
        kind = node.get("type") if isinstance(node, dict) else None
        try:
            if kind in ("dict", "OrderedDict", "Namespace"):
                items = [(self.node(k, where), v) for k, v in node["items"]]
                items = [(k, self.node(v, f"{where}[{k!r}]")) for k, v in items]
                if kind == "Namespace":
                    import argparse  # only here: it costs every `tenplex` command's start ~40 ms

                    return argparse.Namespace(**dict(items))
                out = (dict if kind == "dict" else collections.OrderedDict)(items)
                if "metadata" in node:
                    out._metadata = self.node(node["metadata"], f"{where}._metadata")
                return out
            if kind in ("list", "tuple", "namedtuple", "torch.Size"):
                items = [self.node(v, f"{where}[{i}]") for i, v in enumerate(node["items"])]
                if kind == "namedtuple":
                    return _namedtuple_class(node["class"], node["fields"])(*items)
                if kind == "torch.Size":
                    import torch

                    return torch.Size(items)
                return items if kind == "list" else tuple(items)
            if kind in ("ndarray", "torch.Tensor", "torch.nn.Parameter"):
                memo_key = (kind, node["file"])
                if memo_key not in self.memo:
                    self.memo[memo_key] = self.array(node, kind)
                return self.memo[memo_key]
            return _decode_scalar(node, kind)
        except SerdeError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
            raise SerdeError(f"malformed manifest node at {where} in {str(self.root / MANIFEST)!r}: {e!r}") from e

    def array(self, node: dict, kind: str) -> Any:
        manifest, rel = str(self.root / MANIFEST), node["file"]
        try:
            file = confined(self.root, rel, "file", _FileError)
        except _FileError as e:
            raise SerdeError(f"{manifest!r}: file {rel!r} is not a file of this save: {e}") from None
        dtype, shape = np_dtype(node["dtype"]), tuple(node["shape"])
        if not os.path.lexists(file):
            raise SerdeError(f"cannot load {str(file)!r}: No such file (named by {manifest!r})")
        try:
            arr = load_npy(file, f"named by {manifest!r}", _FileError)
        except _FileError as e:
            raise SerdeError(f"cannot load {str(file)!r}: {str(e).removeprefix(f'{file}: ')}") from None
        got = as_dtype(arr, dtype)  # the dtype itself, or the raw bits of an older save
        if got is None or arr.shape != shape:
            raise SerdeError(f"{str(file)!r} holds {arr.dtype}{list(arr.shape)}, the manifest says {dtype}{list(shape)}")
        arr = got
        return arr if kind == "ndarray" else self.tensor(arr, node, kind)

    def tensor(self, arr: np.ndarray, node: dict, kind: str) -> Any:
        import torch

        name = node["dtype"]
        if name in RAW:
            t = torch.from_numpy(arr.view(np.int16 if arr.dtype.itemsize == 2 else np.uint8)).view(getattr(torch, name))
        else:
            t = torch.from_numpy(arr)
        device = self.map_location if self.map_location is not None else node["device"]
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError) as e:  # a device this machine lacks
            raise SerdeError(f"cannot place a tensor of {str(self.root / MANIFEST)!r} on device {device!r}: {one_line(e)}") from None
        if kind == "torch.nn.Parameter":
            return torch.nn.Parameter(t, requires_grad=node["requires_grad"])
        return t.requires_grad_(node["requires_grad"])


def _decode_scalar(node: dict, kind: str) -> Any:
    if kind == "None":
        return None
    if kind in ("int", "bool", "str"):
        value = node["value"]
        if type(value).__name__ != kind:
            raise ValueError(f"{kind} node holds {value!r}")
        return value
    if kind == "float":
        return decode_float(node["value"])
    if kind == "complex":
        return complex(decode_float(node["real"]), decode_float(node["imag"]))
    if kind == "bytes":
        return bytes.fromhex(node["hex"])
    if kind == "numpy.generic":
        return np.frombuffer(bytes.fromhex(node["hex"]), dtype=np_dtype(node["dtype"]))[0]
    if kind in ("torch.dtype", "torch.device"):
        import torch

        return getattr(torch, node["value"]) if kind == "torch.dtype" else torch.device(node["value"])
    raise ValueError(f"unknown node type {kind!r}")


def _namedtuple_class(qualified: str, fields: list[str]) -> type:
    """The saved namedtuple class if its module is already imported and it has the same fields,
    else a look-alike. Never imports, and looks names up with `vars` (no module `__getattr__`)."""
    module, _, qualname = qualified.partition(":")
    cls: Any = sys.modules.get(module)
    for part in qualname.split("."):
        cls = vars(cls).get(part) if cls is not None and hasattr(cls, "__dict__") else None
    if isinstance(cls, type) and issubclass(cls, tuple) and list(getattr(cls, "_fields", ())) == list(fields):
        return cls
    return collections.namedtuple(qualname.rpartition(".")[2], fields)
