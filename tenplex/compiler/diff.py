"""diff: the paper's Algorithm 1 (split, re-partition, merge) over two PTCs.

For every dst sub-tensor piece, the src pieces whose global boxes intersect it are found by a
sweep-line (`overlapping_pairs`, never all-pairs). The piece is cut into disjoint fragments such
that every src piece either holds a whole fragment or none of it; each fragment becomes a
`Need` listing all holders (every replica on every device). Local regions no dst piece covers
become `FillOp`s, and dst partition values become `ValueNeed`s.

Raises CompileError when dst needs a tensor src lacks, with another shape or dtype, or a region
no src sub-tensor holds.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import repeat

import attrs

from tenplex.compiler.holders import HolderSets
from tenplex.compiler.need_table import NeedTable
from tenplex.compiler.ops import FillOp, Holder, Need, as_holder, trusted_needs
from tenplex.compiler.pieces import Pieces
from tenplex.ir.box import Box, subtract_all
from tenplex.ir.errors import CompileError
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs


@attrs.frozen
class ValueNeed:
    """Value `name` of dst partition `dst_partition`: a literal, or inherited from holders."""

    dst_partition: str
    name: str
    dst_devices: tuple[int, ...]
    holders: tuple[tuple[int, str], ...]  # (src device, src partition); empty for a literal
    value: object = None


@attrs.frozen
class Diff:
    needs: tuple[Need, ...]  # one per fragment of a dst piece
    fills: tuple[FillOp, ...]
    values: tuple[ValueNeed, ...]
    kinds: dict[str, int] = attrs.field(factory=dict)  # tensor -> its kind: tensors of one kind have alike needs (`_Kinds`)
    table: NeedTable | None = None  # `needs` as columns


def diff(src: PTC, dst: PTC, pieces: Pieces | None = None) -> Diff:
    """`pieces`: both PTCs' piece boxes by number (`Pieces.read(src, dst)` when not given)."""
    needs: list[Need] = []
    layouts: dict[tuple, list] = {}
    pieces = pieces or Pieces.read(src, dst)
    kinds = _Kinds(src, dst, pieces)
    for meta in dst.tensors:
        _check_tensor(src, meta)
        needs.extend(kinds.needs(meta.name, layouts))
    devices_of = dst.allocation.mapping  # by the partitions of `pieces` (no `partition_of` of dst)
    fills = [
        FillOp(d, st.id, box, st.fill)
        for st, pid in zip(dst.subtensors, pieces.dst.pids)
        if not _whole(st)
        for box in st.fill_boxes()
        for d in devices_of[pid]
    ]
    return Diff(tuple(needs), tuple(fills), tuple(_value_needs(src, dst)), kinds.kind_of, kinds.table)


def _whole(st) -> bool:
    """Whether one piece is the whole array (no fill; the common case, cheaper than
    `fill_boxes`)."""
    return len(st.pieces) == 1 and st.pieces[0].local_box.shape == st.shape


class _Kinds:
    """Needs per tensor kind. The needs of a tensor depend on the devices and piece boxes of
    its src and dst sub-tensors, and on its sub-tensor ids only through the holders' sort
    order (device, then src sub-tensor id). So tensors alike in those (a layer's weight, its
    optimizer states, the same weight of the other layers of a stage) get the same needs with
    their own ids put in: a PTC keeps its sub-tensors sorted by id, so a src id's position
    among its tensor's sub-tensors orders as the id does. A kind's needs are kept as a
    template: per need its dst sub-tensor's position, piece, box and holder tuple number; per
    holder tuple its devices, src sub-tensor positions and pieces. Every tensor's needs, the
    first of its kind too, are put from the template: its holder tuples are `HolderRows` (the
    template's columns with its sub-tensor numbers; `HolderSets` gives them to select-sources
    as arrays), and holder tuples that were one object stay one object (select-sources
    numbers holder sets by identity). 4,624 tensors
    are 170 kinds for GPT-3 175B at 1024 -> 768 GPUs. Invariant: the needs of tensors of one
    kind (`kind_of`) are alike row by row (the same boxes, dst positions and devices)."""

    def __init__(self, src: PTC, dst: PTC, pieces: Pieces):
        self.src, self.dst = src, dst
        self.src_pieces, self.dst_pieces = pieces.src.tensors, pieces.dst.tensors
        self.src_numbers, self.holders = pieces.src.numbers, HolderSets(pieces.src.ids)
        self.dst_numbers, self.table = pieces.dst.numbers, NeedTable()
        self.src_parts, self.dst_parts = src.allocation.mapping, dst.allocation.mapping
        self.templates: dict[tuple, tuple[int, list, int, int]] = {}  # key -> kind number, rows, holder templates (first, count)
        self.kind_of: dict[str, int] = {}

    def needs(self, tensor: str, layouts: dict[tuple, list]) -> list[Need]:
        src_ids, spids, scodes = self.src_pieces.get(tensor, ((), (), ()))
        dst_ids, dpids, dcodes = self.dst_pieces[tensor]  # per sub-tensor, in order (`Pieces`)
        ddevs = tuple(map(self.dst_parts.__getitem__, dpids))
        key = (tuple(map(self.src_parts.__getitem__, spids)), scodes, ddevs, dcodes)
        template = self.templates.get(key)
        if template is None:
            # the sub-tensors by their positions (`Pieces`), with the devices of `key`: no
            # `by_tensor` or `partition_of` of either PTC (74k sub-tensors read for 170 kinds)
            src_sts = map(self.src.subtensors.__getitem__, self.src_numbers.get(tensor, ()))
            dst_sts = map(self.dst.subtensors.__getitem__, self.dst_numbers[tensor])
            out = _tensor_needs(self.src, self.dst, tensor, layouts, (list(zip(src_sts, key[0])), list(zip(dst_sts, ddevs))))
            rows, sets = _template(out, src_ids, dst_ids)
            template = self.templates[key] = (len(self.templates), rows, self.holders.add_template(sets), len(sets))
            self.table.add_kind(rows, ddevs, template[2])
        self.kind_of[tensor], rows, first, count = template
        self.table.add_tensor(template[0], self.dst_numbers[tensor])
        holders = self.holders.put(first, count, self.src_numbers.get(tensor, ()))
        return trusted_needs(tensor, rows, ddevs, dst_ids, holders)


def _template(needs: list[Need], src_ids: tuple[str, ...], dst_ids: tuple[str, ...]) -> tuple[list, list]:
    src_pos = {sid: k for k, sid in enumerate(src_ids)}
    dst_pos = {sid: k for k, sid in enumerate(dst_ids)}
    numbers: dict[int, int] = {}  # id of a holder tuple -> its number
    sets: list[tuple[tuple[int, ...], ...]] = []  # devices, src sub-tensor positions, pieces
    rows = []
    for n in needs:
        h = numbers.get(id(n.holders))
        if h is None:
            h = numbers[id(n.holders)] = len(sets)
            sets.append((tuple(d for d, _, _ in n.holders), tuple(src_pos[s] for _, s, _ in n.holders), tuple(i for *_, i in n.holders)))
        rows.append((dst_pos[n.dst_subtensor], n.dst_piece, n.box, h))
    return rows, sets


def _check_tensor(src: PTC, meta) -> None:
    have = src.tensor_map.get(meta.name)
    if have is None:
        raise CompileError(f"dst tensor {meta.name!r} does not exist in src")
    if (have.shape, have.dtype) != (meta.shape, meta.dtype):
        raise CompileError(f"tensor {meta.name!r} is {have.dtype}{list(have.shape)} in src but {meta.dtype}{list(meta.shape)} in dst")


def _tensor_needs(src: PTC, dst: PTC, tensor: str, layouts: dict[tuple, list], rows: tuple[list, list] | None = None) -> list[Need]:
    """Needs of every dst piece of `tensor`, in dst piece order. Work is per distinct box, not
    per piece: replicas of a box (a norm held by every TP rank) meet the same src pieces, so
    they share their fragments and holder tuples. Tensors alike (a weight, its optimizer
    states, the same weight of other layers) have the same dst and src boxes, so where the
    src boxes meeting a dst box are disjoint, the clipped boxes are found once per layout
    (`layouts`, shared by the tensors of one diff). `rows`: the src and the dst sub-tensors
    of `tensor` in PTC order, each with its devices (read from the PTCs when not given)."""
    if rows is None:
        rows = ([(st, src.devices_of_subtensor(st.id)) for st in src.by_tensor.get(tensor, ())],
                [(st, dst.devices_of_subtensor(st.id)) for st in dst.by_tensor[tensor]])  # fmt: skip
    held = _holders_by_box(rows[0])
    src_boxes = list(held)
    dst_items = [(st, devices, j, p.global_box) for st, devices in rows[1] for j, p in enumerate(st.pieces)]
    boxes = list(dict.fromkeys(box for *_, box in dst_items))
    key = (tuple(boxes), tuple(src_boxes))
    layout = layouts.get(key)
    if layout is None:
        layout = layouts[key] = _clipped(boxes, src_boxes)
    parts = {}  # dst box -> (fragments, covered volume)
    for box, (clips, covered) in zip(boxes, layout):
        if covered is None:  # src boxes overlap inside it: refined with their holders
            fragments = _fragments(box, [(src_boxes[k], held[src_boxes[k]]) for k in clips])
            parts[box] = fragments, sum(f.volume for f, _ in fragments)
        else:
            parts[box] = [(c, held[src_boxes[k]]) for c, k in clips], covered
    out = []
    for st, devices, j, box in dst_items:
        fragments, covered = parts[box]
        if covered != box.volume:
            gap = _first_gap(box, [f for f, _ in fragments])
            raise CompileError(f"dst sub-tensor {st.id!r} needs region {gap} of tensor {tensor!r}, which no src sub-tensor holds")
        out.extend(Need(tensor, f, devices, st.id, j, hs) for f, hs in fragments)
    return out


def _clipped(boxes: list[Box], src_boxes: list[Box]) -> list[tuple[list, int | None]]:
    """Per dst box: the src boxes meeting it clipped to it with their indices, in index order,
    and their covered volume; or (the indices, None) when two of the clipped boxes overlap."""
    hits: list[list[int]] = [[] for _ in boxes]
    for di, si in overlapping_pairs(boxes, src_boxes):
        hits[di].append(si)
    out: list[tuple[list, int | None]] = []
    for box, his in zip(boxes, hits):
        clips = [(c, k) for k in sorted(his) if (c := src_boxes[k].intersect(box)) is not None]
        cs = [c for c, _ in clips]
        if len(cs) > 1 and any(i < j for i, j in overlapping_pairs(cs, cs)):
            out.append(([k for _, k in clips], None))
        else:
            out.append((clips, sum(c.volume for c in cs)))
    return out


def _holders_by_box(src_rows: list) -> dict[Box, tuple[Holder, ...]]:
    """Distinct src global boxes of a tensor's sub-tensors (`src_rows`: each with its devices;
    boxes in order of first appearance), each with every (device, sub-tensor, piece) holding
    exactly that box, sorted. All src pieces with one box meet the same dst pieces, so one
    tuple serves every dst piece."""
    fresh: dict[Box, list[Holder]] = defaultdict(list)
    for st, devices in src_rows:
        for i, p in enumerate(st.pieces):
            if not p.global_box.empty:  # meets no dst piece
                fresh[p.global_box].extend(map(as_holder, zip(devices, repeat(st.id), repeat(i))))
    return {box: tuple(sorted(hs)) for box, hs in fresh.items()}


def _fragments(box: Box, groups: list[tuple[Box, tuple[Holder, ...]]]) -> list[tuple[Box, tuple[Holder, ...]]]:
    """Disjoint parts of `box`, each held wholly by the listed holders (fast path when the src
    boxes are disjoint, refinement when they overlap, e.g. tied copies or uneven replicas)."""
    clipped = [(c, hs) for b, hs in groups if (c := b.intersect(box)) is not None]
    boxes = [c for c, _ in clipped]
    if len(boxes) <= 1 or not any(i < j for i, j in overlapping_pairs(boxes, boxes)):
        return clipped
    parts: list[tuple[Box, tuple[Holder, ...]]] = []
    for c, hs in clipped:
        rest = [c]
        refined = []
        for p, phs in parts:
            inter = p.intersect(c)
            if inter is None:
                refined.append((p, phs))
                continue
            refined.append((inter, tuple(sorted(set(phs) | set(hs)))))
            refined.extend((q, phs) for q in p.subtract(inter))
            rest = subtract_all(rest, inter)
        parts = refined + [(r, hs) for r in rest]
    return sorted(parts, key=lambda x: x[0])


def _first_gap(box: Box, covered: list[Box]) -> Box:
    rest = [box]
    for c in covered:
        rest = subtract_all(rest, c)
    return rest[0]


def _value_needs(src: PTC, dst: PTC) -> list[ValueNeed]:
    holders: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for part in src.partitions:
        for name, _ in part.values:
            holders[name].extend((d, part.id) for d in src.allocation.devices_of(part.id))
    shared = {name: tuple(sorted(hs)) for name, hs in holders.items()}  # one tuple per name: select-sources indexes it once
    out = []
    for part in dst.partitions:
        devices = dst.allocation.devices_of(part.id)
        for name, value in part.values:
            if value.value is not None or value.policy == "per-rank":
                out.append(ValueNeed(part.id, name, devices, (), value.value))
            elif not holders[name]:
                raise CompileError(f"dst partition {part.id!r} inherits value {name!r}, which no src partition has")
            else:
                out.append(ValueNeed(part.id, name, devices, shared[name]))
    return out
