"""`save(state, path)` / `load(path)`: nested training state as a directory of `.npy` files.

A drop-in for `torch.save`/`torch.load` of checkpoint-like state (nested dict/list/tuple of
torch tensors, numpy arrays and Python scalars), stored as the tree the FUSE view shows:

    path/state.json              manifest {"format": "tenplex.state", "version": 1, "root": NODE}
    path/<k1>/<k2>/.../<k>.npy   one plain `.npy` per distinct array or tensor, named by key path

File names are keys percent-encoded (`urllib.parse.quote`, `safe=""`; ``""``/``.``/``..``
prefixed with `_`, cut at 100 chars) plus `~<n>` on a collision within a directory; the manifest
records every file, so loading never parses names. A NODE is a JSON object with a `type`:

    dict, OrderedDict, Namespace  {"items": [[KEY, NODE], ...]}  (order kept; KEY: scalar or tuple node;
                                  an OrderedDict's torch `_metadata` is kept as "metadata": NODE)
    list, tuple, torch.Size       {"items": [NODE, ...]};  namedtuple adds "class": "mod:qualname", "fields"
    int, bool, str {"value"};  None {};  float {"value": number, "inf", "-inf", "nan" or "nan:<hex bits>"};
    complex {"real", "imag"};  bytes {"hex"};  numpy.generic {"dtype", "hex"};  torch.dtype/device {"value"}
    ndarray                       {"file", "dtype", "shape"}
    torch.Tensor, torch.nn.Parameter  {"file", "dtype", "shape", "device", "requires_grad"}

`dtype` is a name `np_dtype` understands ("float32", "bool", "bfloat16"; `dtype.str` such as ">f4"
for non-native byte order). bfloat16 and float8 data is stored as raw bits in a same-width
unsigned `.npy` (uint16/uint8); the manifest's dtype says how to view it.

Invariants:
- load(save(x)) equals x exactly: container types, key types and order, dtypes, shapes, bytes,
  requires_grad and device (or `map_location`); Python float NaN sign/payload and inf kept.
- One tensor or array object reached twice is stored once and loaded as one object (views of
  one storage are stored separately; containers are copied, not shared).
- `path` is complete or untouched: the tree is written to a temp dir beside `path`, fsynced,
  and swapped in (`renameat2(RENAME_EXCHANGE)`, else two renames); an existing `path` is
  replaced only after the new tree is complete, and only if it is a file, an empty directory or
  a previous tenplex save (holds `state.json`).
- Unsupported values raise `SerdeError` naming the key path (`state['optimizer']['state'][3]`);
  a missing or corrupt file on load raises `SerdeError` naming the file.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import importlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.runtime.arrays import np_dtype

MANIFEST = "state.json"
FORMAT, VERSION = "tenplex.state", 1
_RAW = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # no portable .npy dtype: stored as raw bits
_NAN_BITS = struct.pack(">d", math.nan).hex()
_SCALARS = (int, bool, float, str, bytes, complex, type(None))
_DICTS = {dict: "dict", collections.OrderedDict: "OrderedDict", argparse.Namespace: "Namespace"}


class SerdeError(TenplexError):
    """A state cannot be saved (unsupported value, unsafe target) or a saved tree cannot be loaded."""


def save(state: Any, path: str | os.PathLike) -> None:
    """Write `state` to the directory `path` (see the module docstring for the format).

    Raises:
        SerdeError: an unsupported value or key (names its key path), a cycle, or an existing
            `path` that is a non-empty directory without `state.json`; nothing is left behind.
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink() and any(path.iterdir()) and not (path / MANIFEST).exists():
        raise SerdeError(f"refusing to replace {str(path)!r}: a non-empty directory without {MANIFEST}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would make the saved tree private
    try:
        root = _Writer(tmp).node(state, "state", "", None, set())
        doc = {"format": FORMAT, "version": VERSION, "root": root}
        _write_fsynced(tmp / MANIFEST, json.dumps(doc, allow_nan=False).encode())
        swap_in(tmp, path)
    finally:
        _remove(tmp)  # after a swap, tmp holds the replaced tree (or file)


def load(path: str | os.PathLike, *, map_location: Any = None) -> Any:
    """Rebuild the state saved at `path`. Torch tensors go to `map_location` (a device or its
    name) or, if None, to the device they were saved from; torch is imported only if needed.

    Raises:
        SerdeError: `path` is not a tenplex save, or a file is missing, corrupt or does not
            match the manifest (names the file).
    """
    path = Path(path)
    try:
        doc = json.loads((path / MANIFEST).read_bytes())
    except (OSError, ValueError) as e:
        raise SerdeError(f"cannot read manifest {str(path / MANIFEST)!r}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise SerdeError(f"{str(path / MANIFEST)!r} is not a {FORMAT} v{VERSION} manifest")
    return _Reader(path, map_location).node(doc.get("root"), "state")


class _Writer:
    def __init__(self, root: Path):
        self.root, self.used, self.memo = root, {"": {MANIFEST}}, {}
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
        if kind in _DICTS:
            items = vars(obj).items() if kind is argparse.Namespace else obj.items()
            pairs = [(k, f"{where}[{k!r}]", v) for k, v in items]
            out = {"type": _DICTS[kind], "items": [[_key(k, at), self.node(v, at, sub, k, active)] for k, at, v in pairs]}
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
        if dtype in _RAW:
            arr = arr.view(f"u{arr.dtype.itemsize}")
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(self.root / rel, "wb") as f:
            np.save(f, arr, allow_pickle=False)
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


def _float(x: float) -> float | str:
    """JSON for a float: the number if finite, else "inf"/"-inf"/"nan", or "nan:<bits>" (sign, payload)."""
    if not math.isnan(x):
        return x if math.isfinite(x) else repr(x)
    bits = struct.pack(">d", x).hex()
    return "nan" if bits == _NAN_BITS else f"nan:{bits}"


def _unfloat(value: float | str) -> float:
    if isinstance(value, str) and value.startswith("nan:"):
        return struct.unpack(">d", bytes.fromhex(value[4:]))[0]
    return float(value)


def _scalar(obj: Any, where: str) -> dict:
    kind = type(obj)
    if kind is type(None):
        return {"type": "None"}
    if kind in (int, bool, str):
        return {"type": kind.__name__, "value": obj}
    if kind is float:
        return {"type": "float", "value": _float(obj)}
    if kind is complex:
        return {"type": "complex", "real": _float(obj.real), "imag": _float(obj.imag)}
    if kind is bytes:
        return {"type": "bytes", "hex": obj.hex()}
    return {"type": "numpy.generic", "dtype": _dtype_name(obj.dtype, where), "hex": obj.tobytes().hex()}


def _dtype_name(dtype: np.dtype, where: str) -> str:
    if dtype.name in _RAW:
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
    if name in _RAW:
        return t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy().view(np_dtype(name))
    try:
        return t.numpy()
    except TypeError as e:
        raise SerdeError(f"cannot save {where}: unsupported dtype {t.dtype}") from e


def _write_fsynced(file: Path, data: bytes) -> None:
    with open(file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def swap_in(tmp: Path, path: Path) -> None:
    """Make `tmp` appear at `path`; on return a replaced old tree (if any) is at `tmp`."""
    if not os.path.lexists(path):
        os.replace(tmp, path)
    elif not _exchange(tmp, path):
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, old / "x")  # a crash before the next rename leaves the old tree here
        try:
            os.replace(tmp, path)
        except OSError:
            os.replace(old / "x", path)
            os.rmdir(old)
            raise
        os.replace(old, tmp)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux `renameat2(RENAME_EXCHANGE)`; False if unavailable."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


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
        except (KeyError, TypeError, ValueError, AttributeError, ImportError) as e:
            raise SerdeError(f"malformed manifest node at {where} in {str(self.root / MANIFEST)!r}: {e!r}") from e

    def array(self, node: dict, kind: str) -> Any:
        file = self.root / node["file"]
        dtype, shape = np_dtype(node["dtype"]), tuple(node["shape"])
        stored = np.dtype(f"u{dtype.itemsize}") if node["dtype"] in _RAW else dtype
        try:
            arr = np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise SerdeError(f"cannot load {str(file)!r}: {e}") from e
        if arr.dtype != stored or arr.shape != shape:
            raise SerdeError(f"{str(file)!r} holds {arr.dtype}{list(arr.shape)}, the manifest says {stored}{list(shape)}")
        arr = arr.view(dtype)
        return arr if kind == "ndarray" else self.tensor(arr, node, kind)

    def tensor(self, arr: np.ndarray, node: dict, kind: str) -> Any:
        import torch

        name = node["dtype"]
        if name in _RAW:
            t = torch.from_numpy(arr.view(np.int16 if arr.dtype.itemsize == 2 else np.uint8)).view(getattr(torch, name))
        else:
            t = torch.from_numpy(arr)
        t = t.to(self.map_location if self.map_location is not None else node["device"])
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
        return _unfloat(node["value"])
    if kind == "complex":
        return complex(_unfloat(node["real"]), _unfloat(node["imag"]))
    if kind == "bytes":
        return bytes.fromhex(node["hex"])
    if kind == "numpy.generic":
        return np.frombuffer(bytes.fromhex(node["hex"]), dtype=np_dtype(node["dtype"]))[0]
    if kind in ("torch.dtype", "torch.device"):
        import torch

        return getattr(torch, node["value"]) if kind == "torch.dtype" else torch.device(node["value"])
    raise ValueError(f"unknown node type {kind!r}")


def _namedtuple_class(qualified: str, fields: list[str]) -> type:
    """The saved namedtuple class if it still imports with the same fields, else a look-alike."""
    module, _, qualname = qualified.partition(":")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if list(getattr(cls, "_fields", ())) == list(fields):
            return cls
    except (ImportError, AttributeError):
        pass
    return collections.namedtuple(qualname.rpartition(".")[2], fields)
