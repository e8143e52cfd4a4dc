"""`save(state, path)`: nested training state (torch tensors, numpy arrays, Python scalars in
dicts, lists, tuples) as a directory of `.npy` files and a manifest (`checkpoint.manifest`).

Invariants (the rest of the format's are in `checkpoint.manifest`):
- one tensor or array object reached twice is stored once;
- `path` is complete or untouched (`checkpoint.swap`); unsupported values raise `SerdeError`
  naming the key path (`state['optimizer']['state'][3]`) and leave nothing behind;
- an I/O error while writing (a full disk, ...) raises `SerdeError` naming the file being
  written and the errno (`No space left on device (ENOSPC)`), and leaves nothing behind.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from tenplex.ir.files import write_failure
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.manifest import FORMAT, MANIFEST, RAW, VERSION, SerdeError, encode_float
from tenplex.runtime.checkpoint.npy import write_npy
from tenplex.runtime.checkpoint.swap import remove, swap_in, write_fsynced

__all__ = ["save"]

_SCALARS = (int, bool, float, str, bytes, complex, type(None))
_DICTS = {dict: "dict", collections.OrderedDict: "OrderedDict"}  # and argparse.Namespace (`_dict_kind`)


def _dict_kind(kind: type) -> str | None:
    """The saved type name of a dict-like type, or None. A Namespace exists only once argparse is
    imported, so it is looked up there (importing argparse costs every `tenplex` command ~40 ms)."""
    argparse = sys.modules.get("argparse")
    return "Namespace" if argparse is not None and kind is argparse.Namespace else _DICTS.get(kind)


def save(state: Any, path: str | os.PathLike) -> None:
    """Write `state` to the directory `path` (see the module docstring for the format); the
    directories above `path` are made when missing.

    Raises:
        SerdeError: an unsupported value or key (names its key path), a cycle, or an existing
            `path` that is a non-empty directory without `state.json`; nothing is left behind.
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink() and any(path.iterdir()) and not (path / MANIFEST).exists():
        raise SerdeError(f"refusing to replace {str(path)!r}: a non-empty directory without {MANIFEST}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # made where it is asked for, as `mkdir -p` would
    except OSError as e:
        raise write_failure(path.parent, e, SerdeError) from None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as e:
        raise write_failure(path.parent / f".{path.name}.tmp-*", e, SerdeError) from None
    os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would make the saved tree private
    try:
        writer = _Writer(tmp)
        root = writer.node(state, "state", "", None, set())
        doc = {"format": FORMAT, "version": VERSION, "root": root}
        writer.writing = tmp / MANIFEST
        write_fsynced(tmp / MANIFEST, json.dumps(doc, allow_nan=False).encode())
        writer.writing = path
        swap_in(tmp, path)
    except OSError as e:  # named as the file of `path` it was to become
        where = writer.writing
        raise write_failure(path / where.relative_to(tmp) if where.is_relative_to(tmp) else where, e, SerdeError) from None
    finally:
        remove(tmp)  # after a swap, tmp holds the replaced tree (or file)


class _Writer:
    def __init__(self, root: Path):
        self.root, self.used, self.memo = root, {"": {MANIFEST}}, {}
        self.writing = root  # the path being written, for an I/O error's message
        self.alive = []  # memo keys are ids: keep the objects alive so an id is never reused

    def node(self, obj: Any, where: str, dir_rel: str, key: Any, active: set[int]) -> dict:
        kind = type(obj)
        if kind in _SCALARS or isinstance(obj, np.generic):
            return _scalar(obj, where)
        torch = sys.modules.get("torch")
        if kind is np.ndarray or (torch is not None and kind in (torch.Tensor, torch.nn.Parameter)):
            return self.array(obj, where, dir_rel, key)
        if torch is not None and kind in (torch.dtype, torch.device):
            return {"type": f"torch.{kind.__name__}", "value": str(obj).removeprefix("torch.")}
        if id(obj) in active:
            raise SerdeError(f"{where} contains itself (a cycle cannot be saved)")
        sub = dir_rel if key is None else self.claim(dir_rel, _name(key), "")
        active = active | {id(obj)}
        if (name := _dict_kind(kind)) is not None:
            items = vars(obj).items() if name == "Namespace" else obj.items()
            pairs = [(k, f"{where}[{k!r}]", v) for k, v in items]
            out = {"type": name, "items": [[_key(k, at), self.node(v, at, sub, k, active)] for k, at, v in pairs]}
            if kind is collections.OrderedDict and hasattr(obj, "_metadata"):  # torch state_dict() module versions
                out["metadata"] = self.node(obj._metadata, f"{where}._metadata", sub, "_metadata", active)
            return out
        if kind in (list, tuple) or (isinstance(obj, tuple) and hasattr(kind, "_fields")) or (torch and kind is torch.Size):
            out = {"type": {list: "list", tuple: "tuple"}.get(kind, "namedtuple")}
            if torch is not None and kind is torch.Size:
                out["type"] = "torch.Size"
            elif out["type"] == "namedtuple":
                out |= {"class": f"{kind.__module__}:{kind.__qualname__}", "fields": list(kind._fields)}
            out["items"] = [self.node(v, f"{where}[{i}]", sub, i, active) for i, v in enumerate(obj)]
            return out
        raise SerdeError(f"cannot save {where}: unsupported type {kind.__module__}.{kind.__qualname__}")

    def array(self, obj: Any, where: str, dir_rel: str, key: Any) -> dict:
        if id(obj) in self.memo:
            return self.memo[id(obj)]
        out = {"type": "ndarray"}
        arr = obj
        if not isinstance(obj, np.ndarray):
            arr = _tensor_to_numpy(obj, where)
            is_param = isinstance(obj, sys.modules["torch"].nn.Parameter)
            out = {"type": "torch.nn.Parameter" if is_param else "torch.Tensor"}
        dtype = _dtype_name(arr.dtype, where)
        rel = self.claim(dir_rel, "root" if key is None else _name(key), ".npy")
        out |= {"file": rel, "dtype": dtype, "shape": list(arr.shape)}
        if out["type"] != "ndarray":
            out |= {"device": str(obj.device), "requires_grad": obj.requires_grad}
        self.writing = self.root / rel
        self.writing.parent.mkdir(parents=True, exist_ok=True)
        with open(self.writing, "wb") as f:
            write_npy(f, arr)
            f.flush()
            os.fsync(f.fileno())
        self.memo[id(obj)] = out
        self.alive.append(obj)
        return out

    def claim(self, dir_rel: str, base: str, ext: str) -> str:
        """A name for `base` unique within `dir_rel` (files and subdirectories share one space)."""
        used = self.used.setdefault(dir_rel, set())
        name, n = base + ext, 1
        while name in used:
            n += 1
            name = f"{base}~{n}{ext}"
        used.add(name)
        return f"{dir_rel}/{name}" if dir_rel else name


def _name(key: Any) -> str:
    name = quote(key if isinstance(key, str) else str(key), safe="")[:100]
    return "_" + name if name in ("", ".", "..") else name


def _key(key: Any, where: str) -> dict:
    if type(key) is tuple:
        return {"type": "tuple", "items": [_key(k, where) for k in key]}
    if type(key) in _SCALARS or isinstance(key, np.generic):
        return _scalar(key, where)
    raise SerdeError(f"cannot save {where}: unsupported key type {type(key).__qualname__}")


def _scalar(obj: Any, where: str) -> dict:
    kind = type(obj)
    if kind is type(None):
        return {"type": "None"}
    if kind in (int, bool, str):
        return {"type": kind.__name__, "value": obj}
    if kind is float:
        return {"type": "float", "value": encode_float(obj)}
    if kind is complex:
        return {"type": "complex", "real": encode_float(obj.real), "imag": encode_float(obj.imag)}
    if kind is bytes:
        return {"type": "bytes", "hex": obj.hex()}
    return {"type": "numpy.generic", "dtype": _dtype_name(obj.dtype, where), "hex": obj.tobytes().hex()}


def _dtype_name(dtype: np.dtype, where: str) -> str:
    if dtype.name in RAW:
        return dtype.name
    if dtype.kind not in "biufc":
        raise SerdeError(f"cannot save {where}: unsupported dtype {dtype}")
    return dtype.name if dtype.isnative else dtype.str


def _tensor_to_numpy(t: Any, where: str) -> np.ndarray:
    import torch

    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise SerdeError(f"cannot save {where}: unsupported tensor (layout {t.layout}, device {t.device})")
    t = t.detach().cpu().resolve_conj().resolve_neg()
    name = str(t.dtype).removeprefix("torch.")
    if name in RAW:
        return t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy().view(np_dtype(name))
    try:
        return t.numpy()
    except TypeError as e:
        raise SerdeError(f"cannot save {where}: unsupported dtype {t.dtype}") from e
