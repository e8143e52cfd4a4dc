"""`tenplex store ls|mount`: a saved state or checkpoint directory as a TensorStore, over FUSE.

    tenplex store ls STORE
    tenplex store mount STORE DIR [--write-back]

STORE is a directory written by `tenplex.save` (it holds `state.json`) or a checkpoint directory
(`ptc.json`, see `tenplex.runtime.reshard`). `open_dir` loads it into an in-memory TensorStore
whose tree is the directory's own: a save's array `<file>.npy` at `/<file>`, a checkpoint's
sub-tensor at `/<partition>/<path>` and its partition's values at `/<partition>/values`. So the
mount shows the same files (`.npy`, `values.json`) as STORE, minus the manifest or `ptc.json`.

`mount` serves the store read-only until SIGINT, SIGTERM or SIGHUP (or an external unmount),
then unmounts and exits 0. It runs in the foreground (start it with `&` to background it); the
mount is tuned for large reads (`tenplex.runtime.fuse.store.mount`) and keeps the page cache between opens,
since only the mount changes its store. With `--write-back` the mount is writable and on exit
`write_back` puts the store back into STORE: the tree is written into a new directory beside
STORE, fsynced, re-read, and swapped in by rename (`renameat2(RENAME_EXCHANGE)` where the kernel
has it); further signals are ignored until that is done. A failed write-back loses the edits
made through the mount (exit 2) and leaves STORE as it was.

Invariants:
- a write-back keeps every file's format: a save's tensors keep their paths and dtypes (shapes
  may change and are recorded in `state.json`); a checkpoint's arrays match its `ptc.json`;
- a write-back that fails (a leaf added, removed or of the wrong dtype or shape, or an I/O
  error) raises StoreDirError naming the path and leaves STORE byte-for-byte as it was, with no
  temporary directory left beside it;
- errors (missing STORE, DIR not a directory or already a mount point, FUSE unavailable) are one
  `StoreDirError` line naming the path, exit status 2 (`tenplex.cli.app`).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
import click

from tenplex.ir.errors import TenplexError

# `import tenplex.cli.app` imports this module: the runtime (numpy I/O, serde, FUSE) loads in the commands
STATE_FILE, PTC_FILE = "state.json", "ptc.json"  # serde.MANIFEST, reshard.PTC_FILE
_ARRAY_NODES = ("ndarray", "torch.Tensor", "torch.nn.Parameter")


class StoreDirError(TenplexError):
    """A store directory cannot be read, mounted or written back; names the path."""


@attrs.frozen
class StoreDir:
    """STORE loaded: `kind` "save" (`meta` is the state.json document) or "checkpoint" (the PTC)."""

    path: Path
    kind: str = attrs.field(validator=attrs.validators.in_(("save", "checkpoint")))
    store: Any  # TensorStore
    meta: Any

    @property
    def tensors(self) -> int:
        return sum(self.store.meta(p).kind == "array" for p in self.store.walk())


def open_dir(path: str | os.PathLike) -> StoreDir:
    """STORE as a TensorStore (module doc). Raises StoreDirError naming what is missing or wrong."""
    from tenplex.runtime.store.tree import StoreError, TensorStore

    root = Path(path)
    if not root.is_dir():
        raise StoreDirError(f"{root}: {'not a directory' if root.exists() else 'no such directory'}")
    kind = "save" if (root / STATE_FILE).is_file() else "checkpoint" if (root / PTC_FILE).is_file() else None
    if kind is None:
        raise StoreDirError(f"{root}: neither a tenplex save ({STATE_FILE}) nor a checkpoint directory ({PTC_FILE})")
    store = TensorStore()
    try:
        return StoreDir(root, kind, store, (_load_save if kind == "save" else _load_checkpoint)(root, store))
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
    import numpy as np

    from tenplex.runtime.arrays import np_dtype
    from tenplex.runtime.checkpoint.save import FORMAT, VERSION
    from tenplex.runtime.fuse.npy import npy_dtype

    try:
        doc = json.loads((root / STATE_FILE).read_bytes())
    except (OSError, ValueError) as e:
        raise StoreDirError(f"{root / STATE_FILE}: cannot read: {e}") from None
    if not isinstance(doc, dict) or (doc.get("format"), doc.get("version")) != (FORMAT, VERSION):
        raise StoreDirError(f"{root / STATE_FILE}: not a {FORMAT} v{VERSION} manifest")
    for node in _array_nodes(doc.get("root")):
        file, dtype, shape = root / node["file"], np_dtype(node["dtype"]), tuple(node["shape"])
        if store.exists(leaf := "/" + node["file"].removesuffix(".npy")):
            continue  # one array reached twice is one file
        try:
            array = np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise StoreDirError(f"{file}: cannot load: {e}") from None
        if array.dtype != npy_dtype(dtype) or array.shape != shape:
            raise StoreDirError(
                f"{file}: holds {array.dtype}{list(array.shape)}, {STATE_FILE} says {node['dtype']}{list(shape)}"
            )
        store.put(leaf, array.view(dtype), copy=False)
    return doc


def _subtensor_leaves(ptc: Any) -> dict[str, str]:
    """Sub-tensor id -> store path, as `reshard` names the files."""
    return {sid: f"/{p.id}/{ptc.subtensor_map[sid].path}" for p in ptc.partitions for sid in p.subtensors}


def _load_checkpoint(root: Path, store: Any) -> Any:
    from tenplex.runtime.reshard import read_checkpoint

    ptc, arrays, values = read_checkpoint(root)
    for sid, leaf in _subtensor_leaves(ptc).items():
        store.put(leaf, arrays[sid], copy=False)
    for pid, named in values.items():
        store.put(f"/{pid}/values", named)
    return ptc


# ---- writing back ---------------------------------------------------------------------------
def write_back(sd: StoreDir) -> None:
    """Replace STORE by the store's current state, atomically (module doc).

    Raises: StoreDirError naming the leaf or file; STORE is then unchanged."""
    from tenplex.runtime.checkpoint.save import swap_in  # the same swap `tenplex.save` commits with
    from tenplex.runtime.store.tree import StoreError

    path = sd.path.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, 0o755)
        (_write_save if sd.kind == "save" else _write_checkpoint)(sd, tmp)
        _fsync_tree(tmp)
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
    import numpy as np

    from tenplex.runtime.arrays import np_dtype
    from tenplex.runtime.fuse.npy import npy_dtype

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
        np.save(tmp / rel, array.view(npy_dtype(array.dtype)), allow_pickle=False)
    (tmp / STATE_FILE).write_text(json.dumps(doc, allow_nan=False))


def _write_checkpoint(sd: StoreDir, tmp: Path) -> None:
    from tenplex.runtime.reshard import write_checkpoint

    leaves = _subtensor_leaves(sd.meta)
    values = {p.id: sd.store.get(f"/{p.id}/values") for p in sd.meta.partitions}
    _extra(sd, set(leaves.values()) | {f"/{pid}/values" for pid in values})
    write_checkpoint(sd.meta, {sid: sd.store.get(leaf) for sid, leaf in leaves.items()}, values, tmp)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for name in [*names, "."]:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# ---- the commands ---------------------------------------------------------------------------
@click.group("store")
def store() -> None:
    """List or mount a saved state (tenplex.save) or a checkpoint directory (ptc.json)."""


@store.command("ls")
@click.argument("src", metavar="STORE")
def ls_cmd(src: str) -> None:
    """List STORE's leaves: path, dtype, shape and bytes (values show as `value`)."""
    from tenplex.compiler.emit import human_bytes, table

    sd = open_dir(src)
    rows = []
    for leaf in sd.store.walk():
        m = sd.store.meta(leaf)
        rows.append([leaf, m.dtype or "value", "" if m.shape is None else str(list(m.shape)), m.nbytes])
    click.echo(f"{src}: {sd.kind}, {sd.tensors} tensors, {human_bytes(sd.store.nbytes())}")
    click.echo(table(["path", "dtype", "shape", "bytes"], rows, align="lllr", indent=""))


def check_mount_point(directory: str) -> str:
    """`directory` resolved; raises StoreDirError unless it is a directory FUSE can mount on."""
    from tenplex.runtime.fuse.store import mount as fuse

    real = os.path.realpath(directory)
    if not os.path.isdir(real):
        raise StoreDirError(f"{directory}: {'not a directory' if os.path.exists(real) else 'no such directory'}")
    if fuse.is_mounted(real):
        raise StoreDirError(f"{directory}: already a mount point (unmount it first: fusermount3 -u {real})")
    if (reason := fuse.fuse_unavailable_reason()) is not None:
        raise StoreDirError(f"{directory}: cannot mount: {reason}")
    return real


@store.command("mount")
@click.argument("src", metavar="STORE")
@click.argument("directory", metavar="DIR")
@click.option("--write-back", "writable", is_flag=True,
              help="Mount writable; on exit write the store back to STORE (atomically; unchanged on failure).")  # fmt: skip
def mount_cmd(src: str, directory: str, writable: bool) -> None:
    """Mount STORE at DIR until SIGINT/SIGTERM (read-only unless --write-back)."""
    from tenplex.compiler.emit import human_bytes
    from tenplex.runtime.fuse.store import mount as fuse

    real = check_mount_point(directory)
    sd = open_dir(src)
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with fuse.mount(sd.store, real, read_only=not writable, keep_cache=True) as m:
            mode = "read-write, written back on exit" if writable else "read-only"
            click.echo(f"tenplex: mounted {src} at {m}: {sd.tensors} tensors, {human_bytes(sd.store.nbytes())}, {mode}")
            while not stop.wait(0.1) and fuse.is_mounted(m):
                pass
        if writable:  # still under our handlers: a second signal cannot cut the write-back short
            write_back(sd)
            click.echo(f"tenplex: wrote the store back to {src}")
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
