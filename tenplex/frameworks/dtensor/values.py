"""Non-tensor state as PTC values: DCP bytes entries (`torch.save` bytes) <-> JSON values.

DCP stores every non-tensor leaf of a state dict (ints, floats, strings, lists, tuples, any
picklable object) as a *bytes entry*: the `torch.save` serialization of the object, listed as
`BytesStorageMetadata` in `.metadata`. tenplex turns a bytes entry into a PTC value:

- when `torch.load(weights_only=True)` decodes it to JSON data that survives a JSON round trip
  unchanged (None, bool, int, finite float, str, and lists / str-keyed dicts of these), the
  value is that data;
- otherwise (tuples, NaN, objects that need arbitrary unpickling, ...) the value is an *opaque
  bytes value* `{"dcp.torch_save": "<base64 of the exact bytes>", "type": "<python type or
  'unknown'>"}`: JSON like every value, carried unchanged, and written back byte for byte.

`python_value` gives a live job the Python object back (opaque values decoded with
`weights_only=True` where that works; otherwise the opaque dict itself is returned).
"""


from __future__ import annotations

import base64
import io
import json
import math
from typing import Any

import torch

__all__ = ["OPAQUE", "bytes_of_value", "is_opaque", "json_exact", "python_value", "value_from_bytes"]

OPAQUE = "dcp.torch_save"


def json_exact(obj: Any) -> bool:
    """True when `obj` is JSON data that a JSON round trip returns unchanged (types included)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return True
    if isinstance(obj, float):
        return math.isfinite(obj)
    if type(obj) is list:
        return all(json_exact(x) for x in obj)
    if type(obj) is dict:
        return all(isinstance(k, str) and json_exact(v) for k, v in obj.items())
    return False


def is_opaque(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {OPAQUE, "type"}


def value_from_bytes(raw: bytes) -> Any:
    """The PTC value of a DCP bytes entry (see the module docstring)."""
    try:
        obj = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception:  # noqa: BLE001 (any unpickling failure means "opaque", not an error)
        return {OPAQUE: base64.b64encode(raw).decode("ascii"), "type": "unknown"}
    if json_exact(obj) and json.loads(json.dumps(obj)) == obj:
        return obj
    return {OPAQUE: base64.b64encode(raw).decode("ascii"), "type": type(obj).__name__}


def bytes_of_value(value: Any) -> bytes:
    """The bytes entry DCP stores for a value: opaque values verbatim, others `torch.save`d."""
    if is_opaque(value):
        return base64.b64decode(value[OPAQUE])
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def python_value(value: Any) -> Any:
    """The object a state dict holds for a value: opaque values decoded when `weights_only`
    loading allows, else returned as the opaque dict."""
    if not is_opaque(value):
        return value
    try:
        return torch.load(io.BytesIO(base64.b64decode(value[OPAQUE])), weights_only=True)
    except Exception:  # noqa: BLE001 (documented: undecodable values stay opaque)
        return value
