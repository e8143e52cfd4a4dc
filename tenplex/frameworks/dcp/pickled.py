"""Plain stand-ins for the classes a DCP `.metadata` pickle names, so that reading one needs no torch.

`dcp.metadata` unpickles `.metadata` into these instead of torch's classes: `import torch` and
`torch.distributed.checkpoint` cost ~4 CPU s, which `tenplex inspect`, `tenplex layout` and
every reader of a DCP index (which only needs names, sizes, dtypes and file offsets) would
otherwise pay. Each stand-in keeps the fields and the unpickling behaviour of its torch
original (torch 2.13):

- `Metadata`, `TensorStorageMetadata`, `BytesStorageMetadata`, `ChunkStorageMetadata`,
  `StorageMeta`, `MetadataIndex` of `torch.distributed.checkpoint.metadata`, `_StorageInfo` of
  `...filesystem`, `SavePlan`, `WriteItem`, `TensorWriteData` of `...planner`: dataclasses with the
  same fields and defaults (unpickling builds them with `__new__` and sets `__dict__`, as for
  torch's); `MetadataIndex` hashes and compares by (fqn, offset) like torch's, so
  `storage_data[MetadataIndex(fqn, offsets)]` finds an entry;
- `TensorProperties` takes the 5-tuple state torch's `__getstate__` writes;
- the enums `_MEM_FORMAT_ENCODING` and `WriteItemType` with torch's values;
- `Size` (`torch.Size`: a tuple of ints), `TorchName` (a torch dtype, layout or memory format,
  by its canonical name `torch.float32`; `str` of it is torch's `str`).

`TORCH_NAMES` maps every attribute of `torch` that is a dtype, layout or memory format (aliases
such as `torch.float` included) to its canonical name; tests/frameworks/test_dcp_pickled.py
checks it and the fields against the installed torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

_METADATA = "torch.distributed.checkpoint.metadata"
_PLANNER = "torch.distributed.checkpoint.planner"


@dataclass(frozen=True, repr=False)
class TorchName:
    """A torch dtype, layout or memory format, by its canonical name (`torch.float32`), which
    is also its `str` and `repr` (as torch's, so that error messages read the same)."""

    name: str

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


_DTYPES = ["bfloat16", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "complex128", "complex32",
           "complex64", "float16", "float32", "float4_e2m1fn_x2", "float64", "float8_e4m3fn", "float8_e4m3fnuz",
           "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "int1", "int16", "int2", "int3", "int32", "int4", "int5",
           "int6", "int64", "int7", "int8", "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "uint1", "uint16",
           "uint2", "uint3", "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8"]  # fmt: skip
_ALIASES = {"short": "int16", "int": "int32", "long": "int64", "half": "float16", "float": "float32", "double": "float64",
            "chalf": "complex32", "cfloat": "complex64", "cdouble": "complex128", "bit": "uint1",
            "legacy_contiguous_format": "contiguous_format"}  # fmt: skip
_LAYOUTS = ["_mkldnn", "jagged", "sparse_bsc", "sparse_bsr", "sparse_coo", "sparse_csc", "sparse_csr", "strided"]
_FORMATS = ["channels_last", "channels_last_3d", "contiguous_format", "preserve_format"]
TORCH_NAMES = {n: f"torch.{_ALIASES.get(n, n)}" for n in (*_DTYPES, *_ALIASES, *_LAYOUTS, *_FORMATS)}
DTYPES = frozenset(f"torch.{n}" for n in _DTYPES)  # the canonical names that are dtypes
_VALUES = {n: TorchName(full) for n, full in TORCH_NAMES.items()}
_BY_FULL_NAME = {v.name: v for v in _VALUES.values()}
_LAYOUT_BY_STR = {f"torch.{n}": _VALUES[n] for n in _LAYOUTS}


def torch_value(name: str) -> TorchName | None:
    """`torch.<name>` when it is a dtype, layout or memory format (as unpickling `torch <name>` gives)."""
    return _VALUES.get(name)


def get_layout(name: str) -> TorchName:
    """`torch.serialization._get_layout`: a layout by its `str` (`torch.strided`); KeyError else."""
    return _LAYOUT_BY_STR[name]


class Size(tuple):
    """`torch.Size`: a tuple of ints (unpickled as `Size((1, 2))`)."""

    def __new__(cls, values: Any = ()) -> Size:
        out = super().__new__(cls, values)
        bad = next((i for i, v in enumerate(out) if type(v) is not int), None)
        if bad is not None:
            raise TypeError(f"torch.Size() takes an iterable of 'int' (item {bad} is '{type(out[bad]).__name__}')")
        return out

    def __repr__(self) -> str:
        return f"torch.Size({list(self)})"


class _MEM_FORMAT_ENCODING(enum.Enum):  # noqa: N801 (torch's name, which the pickle names)
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


_MEMORY_FORMATS = dict(zip(_MEM_FORMAT_ENCODING, ("torch.contiguous_format", "torch.channels_last", "torch.preserve_format")))


class WriteItemType(enum.Enum):
    TENSOR = 1
    SHARD = 2
    BYTE_IO = 3


@dataclass
class TensorProperties:
    dtype: Any = field(default_factory=lambda: _BY_FULL_NAME["torch.float32"])  # torch's default default dtype
    layout: Any = field(default=_BY_FULL_NAME["torch.strided"])
    requires_grad: bool = False
    memory_format: Any = field(default=_BY_FULL_NAME["torch.contiguous_format"])
    pin_memory: bool = False

    def __setstate__(self, state: tuple) -> None:
        # torch's __setstate__: a 5-tuple, the memory format as its _MEM_FORMAT_ENCODING
        self.dtype, self.layout, self.requires_grad, encoding, self.pin_memory = state
        if encoding not in _MEMORY_FORMATS:
            raise RuntimeError(f"Invalid torch.memory_format encoding: {encoding}")
        self.memory_format = _BY_FULL_NAME[_MEMORY_FORMATS[encoding]]


@dataclass
class ChunkStorageMetadata:
    offsets: Any
    sizes: Any


@dataclass
class TensorStorageMetadata:
    properties: Any
    size: Any
    chunks: Any


@dataclass
class BytesStorageMetadata:
    pass


@dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: Any = None
    load_id: Any = None
    modules: list = field(default_factory=list)


@dataclass
class Metadata:
    state_dict_metadata: Any
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Any = None
    version: Any = None


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Any = None
    index: Any = field(hash=False, compare=False, default=None)

    def __init__(self, fqn: str, offset: Any = None, index: Any = None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        if offset is not None:
            object.__setattr__(self, "offset", Size(offset))


@dataclass
class _StorageInfo:
    relative_path: Any
    offset: Any
    length: Any
    transform_descriptors: Any = None


@dataclass(frozen=True)
class SavePlan:
    items: Any
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass(frozen=True)
class WriteItem:
    index: Any
    type: Any
    bytes_io_data: Any = None
    tensor_data: Any = None


@dataclass(frozen=True)
class TensorWriteData:
    chunk: Any
    properties: Any
    size: Any


_METADATA_CLASSES = (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata,
                     BytesStorageMetadata, StorageMeta, Metadata, MetadataIndex)  # fmt: skip
CLASSES: dict[tuple[str, str], Any] = {
    **{(_METADATA, c.__name__): c for c in _METADATA_CLASSES},
    **{(_PLANNER, c.__name__): c for c in (SavePlan, WriteItem, WriteItemType, TensorWriteData)},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): Size,
    ("torch.serialization", "_get_layout"): get_layout,
}
"""(module, name) in a pickle -> its stand-in, for the classes above."""

