"""A saved state or checkpoint directory as an in-memory `TensorStore`, and written back.

STORE is a directory written by `tenplex.save` (it holds `state.json`) or a checkpoint directory
(`ptc.json`, `checkpoint.directory`). `open_dir` loads it into a TensorStore whose tree is the
directory's own: a save's array `<file>.npy` at `/<file>`, a checkpoint's sub-tensor at
`/<partition>/<path>` and its partition's values (if it has any) at `/<partition>/values`; so a
FUSE mount of the store shows the same files (`.npy`, `values.json`) as STORE, minus the manifest
or `ptc.json`. C-order arrays are held as `.npy` images (`store.image`), so a read-only mount
hands the kernel their memory files (FUSE passthrough: reads and `mmap` as fast as tmpfs). Arrays are written back as `checkpoint.npy` writes them (a bfloat16 or float8
header names its dtype), and read in that format or the raw bits of older versions.
`write_back` puts the store back into STORE: the tree is written into a new directory beside
STORE, fsynced, re-read, and swapped in by rename (`checkpoint.swap`).

Invariants:
- `StoreDir.path` is absolute and resolved when `open_dir` returns: a write-back goes to the
  directory that was opened whatever the working directory is by then (FUSE may change it);
- a write-back keeps every file's format: a save's tensors keep their paths and dtypes (shapes
  may change and are recorded in `state.json`); a checkpoint's arrays match its `ptc.json`;
- a save's files are read only as regular files inside STORE (no "..", absolute or empty path
  in `state.json`; no FIFO or device), and a `.npy` header must match its file's size before
  the array is allocated (a header claiming 10^12 elements is refused, not a MemoryError);
- a write-back that fails (a leaf added, removed or of the wrong dtype or shape, or an I/O
  error) raises StoreDirError naming the path and leaves STORE byte-for-byte as it was, with no
  temporary directory left beside it.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import check_relative, read_json
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.directory import PTC_FILE, read_checkpoint, write_checkpoint
from tenplex.runtime.checkpoint.manifest import FORMAT, MANIFEST, VERSION
from tenplex.runtime.checkpoint.npy import as_dtype, map_npy, write_npy
from tenplex.runtime.checkpoint.swap import swap_in, sync_tree
from tenplex.runtime.store.image import put_image
from tenplex.runtime.store.tree import StoreError, TensorStore

__all__ = ["StoreDir", "StoreDirError", "open_dir", "write_back"]

_ARRAY_NODES = ("ndarray", "torch.Tensor", "torch.nn.Parameter")
MAX_MANIFEST_BYTES = 64 << 20


class StoreDirError(TenplexError):
    """A store directory cannot be read, mounted or written back; names the path."""


@attrs.frozen
class StoreDir:
    """STORE loaded: `kind` "save" (`meta` is the state.json document) or "checkpoint" (the PTC);
    `path` is absolute (module doc)."""

    path: Path = attrs.field(validator=lambda _, a, v: _check_absolute(v))
    kind: str = attrs.field(validator=attrs.validators.in_(("save", "checkpoint")))
    store: TensorStore
    meta: Any

    @property
    def tensors(self) -> int:
        return sum(self.store.meta(p).kind == "array" for p in self.store.walk())


def _check_absolute(path: Path) -> None:
    if not path.is_absolute():
        raise StoreDirError(f"{path}: a store directory's path must be absolute (resolve it before the cwd can change)")


def open_dir(path: str | os.PathLike) -> StoreDir:
    """STORE as a TensorStore (module doc). Raises StoreDirError naming what is missing or wrong."""
    root = Path(path)
    if not root.is_dir():
        raise StoreDirError(f"{root}: {'not a directory' if root.exists() else 'no such directory'}")
    # present at all (a FIFO or a link to /dev/zero too): the reader says what is wrong with it
    kind = "save" if os.path.lexists(root / MANIFEST) else "checkpoint" if os.path.lexists(root / PTC_FILE) else None
    if kind is None:
        raise StoreDirError(f"{root}: neither a tenplex save ({MANIFEST}) nor a checkpoint directory ({PTC_FILE})")
    store = TensorStore()
    try:
        return StoreDir(root.resolve(), kind, store, (_load_save if kind == "save" else _load_checkpoint)(root, store))
    except StoreDirError:
        store.close()
        raise
    except (StoreError, TenplexError, KeyError, TypeError, ValueError) as e:  # a malformed tree
        store.close()
        raise StoreDirError(f"{root}: cannot load: {e!s}") from None


def _array_nodes(node: Any) -> list[dict]:
    """The array nodes of a state.json tree, in document order."""
    if isinstance(node, dict) and node.get("type") in _ARRAY_NODES:
        return [node]
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return [a for child in children for a in _array_nodes(child)]


def _load_save(root: Path, store: Any) -> dict:
    doc = read_json(root / MANIFEST, StoreDirError, "manifest", MAX_MANIFEST_BYTES)
    if not isinstance(doc, dict) or (doc.get("format"), doc.get("version")) != (FORMAT, VERSION):
        raise StoreDirError(f"{root / MANIFEST}: not a {FORMAT} v{VERSION} manifest")
    for node in _array_nodes(doc.get("root")):
        file, dtype, shape = root / _inside(node["file"]), np_dtype(node["dtype"]), tuple(node["shape"])
        if store.exists(leaf := "/" + node["file"].removesuffix(".npy")):
            continue  # one array reached twice is one file
        array = map_npy(file, "an array of the save", StoreDirError)
        got = as_dtype(array, dtype)  # the dtype itself, or the raw bits older versions wrote
        if got is None or array.shape != shape:
            raise StoreDirError(
                f"{file}: holds {array.dtype}{list(array.shape)}, {MANIFEST} says {node['dtype']}{list(shape)}"
            )
        _adopt(store, leaf, got)
    return doc


def _adopt(store: TensorStore, leaf: str, mapped: np.ndarray) -> None:
    """Store an array read from its mapped file: a C-order one as a `.npy` image (`store.image`:
    a read-only mount hands the kernel its memory file, FUSE passthrough), others in memory as
    they are laid out; either way one copy out of the file, the read."""
    if mapped.flags.c_contiguous and mapped.size:
        try:
            put_image(store, leaf, mapped)
            return
        except OSError as e:  # out of descriptors (an image holds two): this one in plain memory
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
    store.put(leaf, np.array(mapped, order="K"), copy=False)


def _inside(file: Any) -> str:
    """`file` (a save's array path) if it is relative and stays inside the save."""
    if not isinstance(file, str) or file.startswith("/"):
        raise StoreDirError(f"{MANIFEST}: file {file!r} is not a relative path inside the save")
    try:
        return check_relative(file, "file", StoreDirError)
    except StoreDirError:
        raise StoreDirError(f"{MANIFEST}: file {file!r} is not a relative path inside the save") from None


def _subtensor_leaves(ptc: Any) -> dict[str, str]:
    """Sub-tensor id -> store path, as `reshard` names the files."""
    return {sid: f"/{p.id}/{ptc.subtensor_map[sid].path}" for p in ptc.partitions for sid in p.subtensors}


def _load_checkpoint(root: Path, store: Any) -> Any:
    ptc, arrays, values = read_checkpoint(root, mapped=True)
    for sid, leaf in _subtensor_leaves(ptc).items():
        _adopt(store, leaf, arrays.pop(sid))
    for pid, named in values.items():
        if named:
            store.put(f"/{pid}/values", named)
    return ptc


def write_back(sd: StoreDir) -> None:
    """Replace STORE by the store's current state, atomically (module doc).

    Raises: StoreDirError naming the leaf or file; STORE is then unchanged."""
    path = sd.path  # resolved by open_dir, before any mount could change the cwd
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, 0o755)
        (_write_save if sd.kind == "save" else _write_checkpoint)(sd, tmp)
        sync_tree(tmp)
        open_dir(tmp).store.close()  # the new tree reads back in full
        swap_in(tmp, path)
    except (StoreError, TenplexError, OSError) as e:
        raise StoreDirError(f"{path}: write-back failed, left unchanged: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # after the swap: the old tree


def _extra(sd: StoreDir, leaves: set[str]) -> None:
    if extra := sorted(set(sd.store.walk()) - leaves):
        raise StoreDirError(f"{', '.join(extra[:3])}: not part of the {sd.kind} (it has no place for new files)")


def _write_save(sd: StoreDir, tmp: Path) -> None:
    doc = copy.deepcopy(sd.meta)
    files: dict[str, Any] = {}
    for node in _array_nodes(doc["root"]):
        leaf = "/" + node["file"].removesuffix(".npy")
        array = sd.store.get(leaf)
        if not isinstance(array, np.ndarray) or array.dtype != np_dtype(node["dtype"]):
            raise StoreDirError(
                f"{leaf}: holds {getattr(array, 'dtype', type(array).__name__)}, the save's {node['dtype']} (a save keeps its dtypes)"
            )
        node["shape"] = list(array.shape)
        files[node["file"]] = array
    _extra(sd, {"/" + f.removesuffix(".npy") for f in files})
    for rel, array in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp / rel, "wb") as f:
            write_npy(f, array)
    (tmp / MANIFEST).write_text(json.dumps(doc, allow_nan=False))


def _write_checkpoint(sd: StoreDir, tmp: Path) -> None:
    leaves = _subtensor_leaves(sd.meta)
    values = {p.id: sd.store.get(f"/{p.id}/values") if sd.store.exists(f"/{p.id}/values") else {}
              for p in sd.meta.partitions}  # fmt: skip
    _extra(sd, set(leaves.values()) | {f"/{pid}/values" for pid in values})
    write_checkpoint(sd.meta, {sid: sd.store.get(leaf) for sid, leaf in leaves.items()}, values, tmp)

