"""Unpickling a DCP `.metadata` file without letting it run code.

DCP writes `.metadata` with `pickle.dump(Metadata)` and its `FileSystemReader` reads it back with
`pickle.load`, which calls any function the file names. tenplex unpickles it with a restricted
unpickler whose `find_class` allows only what DCP's metadata holds, and loads torch's classes as
their plain stand-ins of `dcp.pickled` (so reading an index needs no torch):

- the classes of `torch.distributed.checkpoint.metadata` (`Metadata`, `TensorStorageMetadata`,
  `BytesStorageMetadata`, `ChunkStorageMetadata`, `TensorProperties`, `MetadataIndex`,
  `StorageMeta`, and its enums such as `_MEM_FORMAT_ENCODING`), and
  `torch.distributed.checkpoint.filesystem._StorageInfo`;
- the save plans megatron-core keeps in `Metadata.all_local_plans` (`torch_dist` checkpoints):
  `SavePlan`, `WriteItem`, `WriteItemType`, `TensorWriteData` of `torch.distributed.checkpoint.planner`;
- `torch.Size`, the torch dtypes, layouts and memory formats (`torch.float32`, ...) and
  `torch.serialization._get_layout` (a layout by name);
- `pathlib` paths (`StorageMeta.checkpoint_id`), `collections.OrderedDict`, `set`, `frozenset`.

Anything else is refused with a one-line `DcpError` naming the file and the class, and how to
opt in: `trust_pickles=True` (`--trust-pickles`) unpickles any class, as DCP does, for trusted
files (DCP's own classes still as their stand-ins).

The file is read whole first (it is small: one entry per chunk), so a length field in a corrupt
pickle cannot make the unpickler allocate more than the file holds, and its opcodes are scanned
(`pickletools.genops`) before unpickling: a memo index past the file's length is refused, since
the C unpickler would size its memo table to it (a 4-byte index asks for 32 GiB).

Invariants:
- without `trust_pickles`, no callable outside the list above is looked up or called;
- every failure is a `DcpError` naming the file; only a regular file is opened.
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
import pickletools
from pathlib import Path
from typing import Any

from tenplex.frameworks.dcp import pickled
from tenplex.frameworks.dcp.format import DcpError
from tenplex.ir.files import one_line, open_regular

__all__ = ["OPT_IN", "load_metadata"]

OPT_IN = "pass --trust-pickles (trust_pickles=True) to load it anyway if you trust the file"
_FIXED: dict[tuple[str, str], Any] = {
    **pickled.CLASSES,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    **{("pathlib", name): getattr(pathlib, name) for name in ("Path", "PosixPath", "PurePath", "PurePosixPath")},
}


def allowed_global(module: str, name: str) -> Any | None:
    """The object `module.name` may load as in a `.metadata` pickle, or None when refused."""
    if (module, name) in _FIXED:
        return _FIXED[(module, name)]
    return pickled.torch_value(name) if module == "torch" else None


class _Refused(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = allowed_global(module, name)
        if obj is None:
            raise _Refused(f"{module}.{name}")
        return obj


class _TrustingUnpickler(pickle.Unpickler):
    """Loads any class (the caller trusts the file), DCP's own as their stand-ins."""

    def find_class(self, module: str, name: str) -> Any:
        obj = allowed_global(module, name)
        return super().find_class(module, name) if obj is None else obj

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not used by DCP metadata")


_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"})


def _check_memo(data: bytes) -> None:
    """Raises UnpicklingError for a memo index no file of this length could need."""
    for op, arg, pos in pickletools.genops(data):
        if op.name in _MEMO_OPS and (not isinstance(arg, int) or not 0 <= arg <= len(data)):
            raise pickle.UnpicklingError(f"memo index {arg!r} at byte {pos} is past the file's {len(data)} bytes")


def load_metadata(path: Path, *, trust_pickles: bool = False) -> Any:
    """The object pickled in `.metadata` file `path` (see the module docstring).

    Raises:
        DcpError: the file is missing, not a regular file, not a pickle, or names a class
            outside the allow-list (names the file and the class)."""
    with open_regular(path, "not a DCP checkpoint directory", DcpError) as f:
        data = f.read()
    try:
        if trust_pickles:
            return _TrustingUnpickler(io.BytesIO(data)).load()  # noqa: S301 (the caller trusts this file)
        _check_memo(data)
        return _Unpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise DcpError(f"{path}: refusing to unpickle {e.name!r}: not a class of DCP metadata, and unpickling it "
                       f"could run code; {OPT_IN}") from None  # fmt: skip
    except RecursionError:
        raise DcpError(f"{path}: not a readable DCP metadata file (nested too deeply)") from None
    except Exception as e:  # noqa: BLE001 (a corrupt pickle raises almost anything)
        raise DcpError(f"{path}: not a readable DCP metadata file ({type(e).__name__}: {one_line(e, 200)})") from None
