"""The format of a saved state (`tenplex.save` / `tenplex.load`): nested training state as a directory
of `.npy` files and one manifest.

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
for non-native byte order). A bfloat16 or float8 array's `.npy` names its dtype in the header
(`descr: 'bfloat16'`, `checkpoint.npy`): `np.load` returns it where ml_dtypes is imported and
refuses the file where it is not. Older tenplex versions stored the raw bits (uint16/uint8)
instead; `load` reads both, viewing the bits as the manifest's dtype.

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

import math
import struct

from tenplex.ir.errors import TenplexError
from tenplex.runtime.arrays import EXTRA_DTYPES

__all__ = ["FORMAT", "MANIFEST", "RAW", "VERSION", "SerdeError", "decode_float", "encode_float"]

MANIFEST = "state.json"
FORMAT, VERSION = "tenplex.state", 1
RAW = EXTRA_DTYPES  # ml_dtypes, not numpy: torch sees them through integer views
_NAN_BITS = struct.pack(">d", math.nan).hex()


class SerdeError(TenplexError):
    """A state cannot be saved (unsupported value, unsafe target) or a saved tree cannot be loaded."""


def encode_float(x: float) -> float | str:
    """JSON for a float: the number if finite, else "inf"/"-inf"/"nan", or "nan:<bits>" (sign, payload)."""
    if not math.isnan(x):
        return x if math.isfinite(x) else repr(x)
    bits = struct.pack(">d", x).hex()
    return "nan" if bits == _NAN_BITS else f"nan:{bits}"


def decode_float(value: float | str) -> float:
    if isinstance(value, str) and value.startswith("nan:"):
        return struct.unpack(">d", bytes.fromhex(value[4:]))[0]
    return float(value)
