"""`tenplex.ptc/1` JSON: strict parsing and canonical printing of a PTC.

Parsing builds nothing until the whole document is checked: any unknown key, wrong type,
out-of-range box, dangling id or name with a NUL byte raises `ParseError` naming the source
and the field, e.g.
`ptc.json: subtensors["w/tp1"].pieces[0].global: ...`. Printing is canonical (fixed key order,
maps sorted by name), so `print(parse(text)) == text` for canonical text and
`parse(print(ptc)) == ptc` for every PTC.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any, TypeVar

from tenplex.ir.box import Box
from tenplex.ir.errors import IRError, ParseError
from tenplex.ir.files import read_json, reject_constant, write_atomic
from tenplex.ir.names import check_name
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Links, Topology

FORMAT = "tenplex.ptc/1"
T = TypeVar("T")


class JsonDoc:
    """Typed access to a JSON node that reports the field path on error."""

    def __init__(self, source: str):
        self.source = source
        self.raw_subtensors: dict = {}

    def fail(self, where: str, msg: str) -> ParseError:
        return ParseError(f"{self.source}: {where}: {msg}")

    def obj(self, node: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(node, dict):
            raise self.fail(where, f"expected an object, got {type(node).__name__}")
        unknown = sorted(set(node) - set(required) - set(optional))
        if unknown:
            raise self.fail(where, f"unknown key {unknown[0]!r} (allowed: {', '.join(required + optional)})")
        missing = [k for k in required if k not in node]
        if missing:
            raise self.fail(where, f"missing key {missing[0]!r}")
        return node

    def typed(self, node: Any, where: str, kind: type | tuple[type, ...], what: str) -> Any:
        if isinstance(node, bool) and kind is not bool or not isinstance(node, kind):
            raise self.fail(where, f"expected {what}, got {node!r}")
        return node

    def build(self, where: str, make: Callable[[], T]) -> T:
        try:
            return make()
        except (IRError, TypeError) as e:
            raise self.fail(where, str(e)) from None

    def name(self, node: Any, where: str, what: str) -> str:
        """A name or id: a string without NUL bytes (`tenplex.ir.names`)."""
        self.typed(node, where, str, f"a {what}")
        self.build(where, lambda: check_name(what, node))
        return node

    def box(self, node: Any, where: str) -> Box:
        self.typed(node, where, list, "a list of [start, stop] pairs")
        return self.build(where, lambda: Box.from_list(node))


def _links(doc: JsonDoc, node: Any) -> Links:
    doc.obj(node, "links", (), ("device", "host", "network"))
    return doc.build("links", lambda: Links(**node))


def _topology(doc: JsonDoc, root: dict) -> Topology:
    devices = []
    for i, d in enumerate(doc.typed(root["devices"], "devices", list, "a list of devices")):
        w = f"devices[{i}]"
        doc.obj(d, w, ("id", "host"))
        devices.append(doc.build(w, lambda d=d: Device(d["id"], d["host"])))
    links = _links(doc, root["links"]) if "links" in root else Links()
    return doc.build("devices", lambda: Topology(tuple(devices), links))


def _tensor(doc: JsonDoc, name: str, node: Any) -> TensorMeta:
    w = f"tensors[{name!r}]"
    doc.name(name, w, "tensor name")
    doc.obj(node, w, ("shape", "dtype"))
    doc.typed(node["shape"], w + ".shape", list, "a list of integers")
    doc.typed(node["dtype"], w + ".dtype", str, "a dtype name")
    return doc.build(w, lambda: TensorMeta(name, tuple(node["shape"]), node["dtype"]))


_BOX_ENTRY = ({"tensor", "path", "box"}, {"tensor", "path", "box", "fill"})  # the keys of a plain `box` entry


def _box_subtensor(sid: Any, node: Any) -> SubTensor | None:
    """The sub-tensor of a `box` entry whose every field is plainly valid (names without NUL
    bytes, `[start, stop]` pairs of ints with 0 <= start <= stop, a number as fill), built
    without the per-field checks (~5x faster: most of parsing a PTC file); None for any other
    entry, which `_subtensor` then parses field by field and reports what is wrong with."""
    if type(node) is not dict or node.keys() not in _BOX_ENTRY:
        return None
    tensor, path, pairs, fill = node["tensor"], node["path"], node["box"], node.get("fill", 0)
    if not (type(sid) is str and type(tensor) is str and type(path) is str and type(pairs) is list
            and type(fill) in (int, float) and "\0" not in sid + tensor + path):  # fmt: skip
        return None
    for p in pairs:
        if not (type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is int and 0 <= p[0] <= p[1]):
            return None
    box = Box._trusted(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
    return SubTensor._of_box(sid, tensor, path, box, fill)


def _subtensor(doc: JsonDoc, sid: str, node: Any) -> SubTensor:
    fast = _box_subtensor(sid, node)
    if fast is not None:
        return fast
    w = f"subtensors[{sid!r}]"
    doc.name(sid, w, "sub-tensor id")
    if isinstance(node, dict) and "box" in node:
        doc.obj(node, w, ("tensor", "path", "box"), ("fill",))
        box = doc.box(node["box"], w + ".box")
        pieces = [Piece(box, Box._trusted((0,) * box.ndim, box.shape))]  # a checked box's shape
        shape = box.shape
    else:
        doc.obj(node, w, ("tensor", "path", "shape", "pieces"), ("fill",))
        doc.typed(node["shape"], w + ".shape", list, "a list of integers")
        shape = tuple(node["shape"])
        pieces = []
        for i, p in enumerate(doc.typed(node["pieces"], w + ".pieces", list, "a list of pieces")):
            pw = f"{w}.pieces[{i}]"
            doc.obj(p, pw, ("global", "local"))
            g, lo = doc.box(p["global"], pw + ".global"), doc.box(p["local"], pw + ".local")
            pieces.append(doc.build(pw, lambda g=g, lo=lo: Piece(g, lo)))
    doc.name(node["tensor"], w + ".tensor", "tensor name")
    doc.typed(node["path"], w + ".path", str, "a path string")
    doc.name(node["path"], w + ".path", "path")
    fill = doc.typed(node.get("fill", 0), w + ".fill", (int, float), "a number")
    return doc.build(w, lambda: SubTensor(sid, node["tensor"], node["path"], shape, tuple(pieces), fill))


def _partition(doc: JsonDoc, pid: str, node: Any) -> Partition:
    w = f"partitions[{pid!r}]"
    doc.name(pid, w, "partition id")
    doc.obj(node, w, ("subtensors",), ("values",))
    subs = doc.typed(node["subtensors"], w + ".subtensors", list, "a list of sub-tensor ids")
    for k, sid in enumerate(subs):
        doc.name(sid, f"{w}.subtensors[{k}]", "sub-tensor id")
    values = {}
    for name, v in doc.typed(node.get("values", {}), w + ".values", dict, "an object").items():
        vw = f"{w}.values[{name!r}]"
        doc.name(name, vw, "value name")
        doc.obj(v, vw, (), ("value", "policy"))
        values[name] = doc.build(vw, lambda v=v: Value(v.get("value"), v.get("policy", "replicated")))
    return doc.build(w, lambda: Partition(pid, tuple(subs), values))


def _allocation(doc: JsonDoc, node: Any) -> Allocation:
    doc.typed(node, "allocation", dict, "an object")
    for pid, devs in node.items():
        doc.name(pid, f"allocation[{pid!r}]", "partition id")
        doc.typed(devs, f"allocation[{pid!r}]", list, "a list of device ids")
        for d in devs:
            doc.typed(d, f"allocation[{pid!r}]", int, "integer device ids")
    return doc.build("allocation", lambda: Allocation(node))


def ptc_from_json(root: Any, source: str = "<ptc>") -> PTC:
    """Parse a `tenplex.ptc/1` document (already JSON-decoded). Raises ParseError."""
    doc = JsonDoc(source)
    doc.obj(root, "document", ("format", "devices", "tensors", "subtensors", "partitions", "allocation"), ("links",))
    if root["format"] != FORMAT:
        raise doc.fail("format", f"expected {FORMAT!r}, got {root['format']!r}")
    topology = _topology(doc, root)
    sections = {k: doc.typed(root[k], k, dict, "an object") for k in ("tensors", "subtensors", "partitions")}
    doc.raw_subtensors = sections["subtensors"]
    tensors = [_tensor(doc, n, v) for n, v in sections["tensors"].items()]
    subtensors = [_subtensor(doc, n, v) for n, v in sections["subtensors"].items()]
    partitions = [_partition(doc, n, v) for n, v in sections["partitions"].items()]
    allocation = _allocation(doc, root["allocation"])
    try:
        return PTC(tuple(tensors), tuple(subtensors), tuple(partitions), allocation, topology)
    except (IRError, TypeError) as e:  # the PTC's verifier found it: named at its field where a reference is wrong
        _check_references(doc, tensors, subtensors, partitions, allocation, topology)
        raise doc.fail("document", str(e)) from None


def _check_references(doc: JsonDoc, tensors, subtensors, partitions, allocation, topology) -> None:
    """Dangling and double references, named at their field; run only once the PTC's verifier
    (which finds each of them, in prose) has refused the document: a valid one is checked once."""
    shapes, boxes = {t.name: t.shape for t in tensors}, {t.name: t.box for t in tensors}
    for st in subtensors:
        w = f"subtensors[{st.id!r}]"
        if st.tensor not in shapes:
            raise doc.fail(w + ".tensor", f"sub-tensor {st.id!r} names unknown tensor {st.tensor!r}")
        whole = boxes[st.tensor]
        for i, p in enumerate(st.pieces):
            if p.global_box.ndim != whole.ndim or not whole.contains(p.global_box):
                at = w + (".box" if "box" in doc.raw_subtensors[st.id] else f".pieces[{i}].global")
                raise doc.fail(at, f"sub-tensor {st.id!r} piece {i} global box {p.global_box} is outside tensor {st.tensor!r} of shape {shapes[st.tensor]}")
    known, owner = {st.id for st in subtensors}, {}
    for part in partitions:
        for k, sid in enumerate(part.subtensors):
            w = f"partitions[{part.id!r}].subtensors[{k}]"
            if sid not in known:
                raise doc.fail(w, f"partition {part.id!r} names unknown sub-tensor {sid!r}")
            if sid in owner:
                raise doc.fail(w, f"sub-tensor {sid!r} is in partitions {owner[sid]!r} and {part.id!r}")
            owner[sid] = part.id
    for st in subtensors:
        if st.id not in owner:
            raise doc.fail(f"subtensors[{st.id!r}]", f"sub-tensors [{st.id!r}] belong to no partition")
    pids = {p.id for p in partitions}
    for pid, devs in allocation.items:
        if pid not in pids:
            raise doc.fail(f"allocation[{pid!r}]", f"allocation names unknown partition {pid!r}")
        for d in devs:
            if not topology.has(d):
                raise doc.fail(f"allocation[{pid!r}]", f"partition {pid!r} is allocated to device {d}, which is not in the topology")
    for pid in sorted(pids - set(allocation.mapping)):
        raise doc.fail("allocation", f"partition {pid!r} is not allocated to any device")


def _subtensor_json(st: SubTensor) -> dict:
    out: dict[str, Any] = {"tensor": st.tensor, "path": st.path}
    only = st.pieces[0] if len(st.pieces) == 1 else None
    if only and not only.flat and only.local_box == st.local_box:
        out["box"] = only.global_box.to_list()
    else:
        out["shape"] = list(st.shape)
        out["pieces"] = [{"global": p.global_box.to_list(), "local": p.local_box.to_list()} for p in st.pieces]
    if st.fill != 0:
        out["fill"] = st.fill
    return out


def ptc_to_json(ptc: PTC) -> dict:
    """The canonical JSON object of a PTC."""
    out: dict[str, Any] = {"format": FORMAT, "devices": [{"id": d.id, "host": d.host} for d in ptc.topology.devices]}
    if ptc.topology.links != Links():
        links = ptc.topology.links
        out["links"] = {"device": links.device, "host": links.host, "network": links.network}
    out["tensors"] = {t.name: {"shape": list(t.shape), "dtype": t.dtype} for t in ptc.tensors}
    out["subtensors"] = {st.id: _subtensor_json(st) for st in ptc.subtensors}
    out["partitions"] = {
        p.id: {"subtensors": list(p.subtensors), "values": {n: {"value": v.value, "policy": v.policy} for n, v in p.values}}
        for p in ptc.partitions
    }
    out["allocation"] = {pid: list(devs) for pid, devs in ptc.allocation.items}
    return out


_LEAF = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode  # `json.dumps` with these options


def _leaf(value: Any) -> str:
    """`_LEAF(value)`, a string (every key) as `JSONEncoder.encode` writes it: no encoder per leaf."""
    return encode_basestring(value) if type(value) is str else _LEAF(value)


def canonical_text(root: dict) -> str:
    """JSON text with one line per top-level scalar and per entry of a top-level map or list,
    so that diffs of PTCs and plans are readable line by line."""
    leaf = _leaf
    lines = []
    for key, value in root.items():
        if isinstance(value, dict) and value:
            body = ",\n".join([f"  {leaf(k)}: {leaf(v)}" for k, v in value.items()])
            lines.append(f" {leaf(key)}: {{\n{body}\n }}")
        elif isinstance(value, list) and value:
            body = ",\n".join([f"  {leaf(v)}" for v in value])
            lines.append(f" {leaf(key)}: [\n{body}\n ]")
        else:
            lines.append(f" {leaf(key)}: {leaf(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def dumps(ptc: PTC) -> str:
    return canonical_text(ptc_to_json(ptc))


def loads(text: str, source: str = "<ptc>") -> PTC:
    try:
        root = json.loads(text, parse_constant=reject_constant)
    except (json.JSONDecodeError, ValueError) as e:
        raise ParseError(f"{source}: not valid JSON: {e}") from None
    return ptc_from_json(root, source)


def load_ptc(path: str | os.PathLike) -> PTC:
    return ptc_from_json(read_json(path), str(path))


def save_ptc(ptc: PTC, path: str | os.PathLike) -> None:
    write_atomic(path, dumps(ptc))
