"""The dst layout of `reshard_dcp`: a mesh shape plus placements per FQN (torch-free).

JSON (or the same dict in Python):

    {"format": "tenplex.dtensor-layout/1",          optional
     "mesh": [2, 2],                                required: the new DeviceMesh shape
     "placements": {                                optional: FQN or pattern -> one per mesh dim
        "model.embed.weight": ["S(0)", "R"],        an exact FQN wins over patterns
        "optim.state.*.exp_avg*": ["S(0)", "S(1)"], fnmatch patterns, first match in order
        "*": ["R", "R"]}}

Placements are `"S(d)"` / `"Shard(d)"`, `"R"` / `"Replicate()"`, and, in layouts only,
`"Stage(s)"` (see `dtensor.stage`): the tensor lives only on the mesh slice whose coordinate along
that dim is `s`, the rule's other placements applying within the slice. With mesh `[2, 1, 2]`
(pp, dp, tp), `"model.blocks.1.attn.q.weight": ["Stage(1)", "R", "S(0)"]` puts the tensor on
ranks 2 and 3, dim 0 split between them; ranks 0 and 1 hold nothing of it. The mesh's ranks are
0..prod(mesh)-1 in row-major order (as `init_device_mesh` lays them out). A tensor that no
entry names gets the **default: the source's placements on the new mesh**, read off the saved
chunks (DCP stores no placements): the tensor dims along which the source's chunks are cut, in
increasing order, are sharded over mesh dims 0, 1, ...; the remaining mesh dims replicate; a
tensor the source did not cut is replicated. So a 1-D source `Shard(1)` stays `Shard(1)` on a
new 1-D mesh of any size, and `[Shard(0), Shard(1)]` on 2×2 stays that on a new 2-D mesh.
`source_layout(src)` writes that default out as a layout (`tenplex layout DCP_DIR`), with the
mesh the chunks suggest: the file a user edits (the mesh sizes) and passes to `reshard --to`.

Invariants:
- the mesh has >= 1 dims, each >= 1; every entry has one placement per mesh dim;
- a `Stage(s)` has `s` inside its mesh dim (`s < mesh[dim]`); the error names the entry and
  the mesh; `to_json` writes it back as `"Stage(s)"`;
- an exact FQN entry must name a tensor of the source and fit it (Shard dims inside its ndim);
  a pattern entry applies to every tensor it matches and must fit it too (the error names the
  pattern, the placement and the tensor's rank), except that patterns which shard skip 0-d
  tensors (a scalar cannot be cut: the next entry or the default applies);
- the mesh is bounded (`boxes.check_mesh`) and so is the PTC a layout makes
  (`layout.check_subtensor_count`, checked before any spec is built);
- unknown keys and a wrong `format` fail, naming the source and the field.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.dtensor.boxes import Placement, PlacementError, Replicate, Shard, check_mesh
from tenplex.frameworks.dtensor.layout import TensorSpec, check_subtensor_count, ptc_from_specs
from tenplex.frameworks.dtensor.stage import LayoutPlacement, Stage, check_stages, parse_layout_placement, stage_slice
from tenplex.ir.files import read_json
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import TensorMeta

FORMAT = "tenplex.dtensor-layout/1"


def _rules(items: Any) -> tuple[tuple[str, tuple[LayoutPlacement, ...]], ...]:
    pairs = items.items() if isinstance(items, Mapping) else items
    return tuple((str(k), tuple(parse_layout_placement(p) if isinstance(p, str) else p for p in v)) for k, v in pairs)


@attrs.frozen
class MeshLayout:
    """A dst DTensor layout: mesh shape and (FQN or pattern, placements) rules in order."""

    mesh: tuple[int, ...] = attrs.field(converter=check_mesh)
    rules: tuple[tuple[str, tuple[LayoutPlacement, ...]], ...] = attrs.field(converter=_rules, factory=tuple)

    def __attrs_post_init__(self) -> None:
        for key, placements in self.rules:
            if len(placements) != len(self.mesh):
                raise PlacementError(f"layout placements[{key!r}] = {[str(p) for p in placements]} need one entry per mesh dim of {list(self.mesh)}")
            check_stages(key, self.mesh, placements)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | str | os.PathLike, source: str = "layout") -> MeshLayout:
        """From a dict, a JSON string or a path to a JSON file. Raises PlacementError naming the
        source and field."""
        if isinstance(doc, os.PathLike) or isinstance(doc, str) and not doc.lstrip().startswith("{"):
            source, doc = str(doc), read_json(Path(doc), PlacementError, "a DTensor layout")
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except (json.JSONDecodeError, RecursionError) as e:
                raise PlacementError(f"{source}: not JSON ({e or 'nested too deeply'})") from None
        if not isinstance(doc, Mapping):
            raise PlacementError(f"{source}: expected an object with 'mesh' and 'placements'")
        unknown = sorted(set(doc) - {"format", "mesh", "placements"})
        if unknown or doc.get("format", FORMAT) != FORMAT or "mesh" not in doc:
            what = f"unknown key {unknown[0]!r}" if unknown else "missing 'mesh'" if "mesh" not in doc else f"format {doc['format']!r} is not {FORMAT!r}"
            raise PlacementError(f"{source}: {what}")
        placements = doc.get("placements", {})
        if not isinstance(placements, Mapping) or not all(isinstance(v, list) for v in placements.values()):
            raise PlacementError(f"{source}: placements must map FQNs or patterns to lists like ['S(0)', 'R']")
        try:
            return cls(tuple(doc["mesh"]), placements)
        except (PlacementError, TypeError) as e:
            raise PlacementError(f"{source}: {e}") from None

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "mesh": list(self.mesh), "placements": {k: [str(p) for p in v] for k, v in self.rules}}

    def placements_for(self, meta: TensorMeta, default: Sequence[Placement]) -> tuple[LayoutPlacement, ...]:
        """The rule for `meta` (exact FQN, else first fitting pattern), else `default`."""
        exact = dict(self.rules).get(meta.name)
        if exact is not None:
            if not _fits(exact, len(meta.shape)):
                raise PlacementError(f"layout placements[{meta.name!r}] = {[str(p) for p in exact]} do not fit tensor {meta.name!r} of shape {list(meta.shape)}")
            return exact
        ndim = len(meta.shape)
        for key, placements in self.rules:
            if not fnmatch.fnmatchcase(meta.name, key) or (ndim == 0 and not _fits(placements, 0)):
                continue
            bad = next((p for p in placements if not _fits((p,), ndim)), None)
            if bad is not None:
                raise PlacementError(f"layout placements[{key!r}] = {[str(p) for p in placements]} match tensor {meta.name!r} "
                                     f"of shape {list(meta.shape)}, but {bad} shards dim {bad.dim} of a {ndim}-d tensor")  # fmt: skip
            return placements
        return tuple(default)


def _fits(placements: Sequence[LayoutPlacement], ndim: int) -> bool:
    return all(not isinstance(p, Shard) or -ndim <= p.dim < ndim for p in placements)


def source_placements(src: PTC, name: str, mesh_ndim: int) -> tuple[Placement, ...]:
    """The default placements of tensor `name` on a new mesh of `mesh_ndim` dims (see above)."""
    boxes = [p.global_box for st in src.by_tensor[name] for p in st.pieces if p.global_box.volume]
    ndim = len(src.tensor_map[name].shape)
    cut = [d for d in range(ndim) if len({(b.start[d], b.stop[d]) for b in boxes}) > 1][:mesh_ndim]
    return tuple(Shard(d) for d in cut) + (Replicate(),) * (mesh_ndim - len(cut))


def source_layout(src: PTC) -> MeshLayout:
    """The layout `src` has now, as far as its chunks tell (DCP stores no mesh or placements):
    mesh dims = the most tensor dims any tensor is cut along; mesh dim i's size = the most
    common number of distinct chunk extents along the i-th cut dim of the tensors cut that
    often (ties: the larger); each cut tensor's `source_placements` as an exact entry, and
    `"*"` replicating the rest. Given to `reshard --to` unchanged it keeps the chunks of every
    tensor that each mesh dim cut along its own tensor dim; a tensor dim cut by two mesh dims
    (`[S(0), S(0)]`) comes out cut by one, and which mesh dim cut a dim is not saved (a source
    `[R, S(0)]` comes out `[S(0), R]`). With other mesh sizes it is that layout on a resized mesh."""
    extents: dict[str, list[int]] = {}
    for meta in src.tensors:
        boxes = [p.global_box for st in src.by_tensor[meta.name] for p in st.pieces if p.global_box.volume]
        counts = [len({(b.start[d], b.stop[d]) for b in boxes}) for d in range(len(meta.shape))]
        extents[meta.name] = [n for n in counts if n > 1]
    ndim = max([len(cuts) for cuts in extents.values()] + [1])
    mesh = []
    for i in range(ndim):
        sizes = Counter(cuts[i] for cuts in extents.values() if len(cuts) > i) or Counter({1: 1})
        mesh.append(max(sizes, key=lambda n: (sizes[n], n)))
    rules = [(name, source_placements(src, name, ndim)) for name, cuts in extents.items() if cuts]
    return MeshLayout(tuple(mesh), [*rules, ("*", (Replicate(),) * ndim)])


def dst_specs(src: PTC, layout: MeshLayout) -> list[TensorSpec]:
    """Each tensor of `src` with its placements under `layout` (rules, else the default), on
    the mesh slice its Stage placements select (the whole mesh when none). Raises
    PlacementError for exact entries naming no tensor of `src` or not fitting one."""
    names = set(src.tensor_map)
    missing = [k for k, _ in layout.rules if not any(c in k for c in "*?[") and k not in names]
    if missing:
        raise PlacementError(f"layout names {missing[:3]}, which the source checkpoint has no tensor for")
    chosen = [(meta, layout.placements_for(meta, source_placements(src, meta.name, len(layout.mesh)))) for meta in src.tensors]
    held = sum(math.prod(m for m, p in zip(layout.mesh, placements) if not isinstance(p, Stage)) for _, placements in chosen)
    check_subtensor_count(held, f"layout on mesh {list(layout.mesh)} for {len(chosen)} tensors")
    return [TensorSpec(meta, *stage_slice(meta.name, layout.mesh, placements)) for meta, placements in chosen]


def dst_ptc(src: PTC, layout: MeshLayout) -> PTC:
    """The PTC of `layout` for the tensors and values of `src` (one partition `rank<r>` per
    rank; see `dtensor.layout`). Raises PlacementError like `dst_specs`."""
    values = {name for p in src.partitions for name, _ in p.values}
    return ptc_from_specs(math.prod(layout.mesh), dst_specs(src, layout), values)
