"""Atoms of `select-sources`: the network regions a dst host needs, cut disjoint, as arrays.

Regions a dst host needs of one tensor from other hosts are cut into disjoint *atoms* (cut to
the message size limit); each atom lists the wants (a need on one dst device) that contain it,
landing first, and its holders by host. Hosts alike (DP replicas of one stage) want the same
needs on their own devices, so their atoms are cut once per distinct shape and differ only in
the wants' devices. `Atoms` keeps every atom as a row of arrays (box, tensor, its wants as a
run of want ids) and emits the copies of all of them as columns once the pass has chosen each
atom's source: the landing copy from the chosen holder, then a forward (`src_side="dst"`, read
from the landing piece behind an order edge) to every other want.
"""

from __future__ import annotations

from collections import defaultdict

import attrs
import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.ops import Holder, Need
from tenplex.ir.box import Box, split_box, subtract_all
from tenplex.ir.sweep import overlapping_pairs

I64 = np.int64
Want = tuple[Need, int]  # a need on one dst device
Shape = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # box ids, want counts, want positions, holder sets
Cut = tuple[Shape, list[list[int]], np.ndarray]  # a shape, the want positions of each holder group, each atom's group


@attrs.frozen
class Far:
    """The wants (a need on one dst device) that cross the network, grouped per (dst host,
    tensor) `names[g]` as the runs `starts[g]:stops[g]`, in want order within each: `need`
    (numbers into `needs`), `dev`, `sid` and `piece` (of the dst sub-tensor) per want, and its
    shape `code` (need number and the device's rank among its group's devices): groups with
    equal codes are cut alike."""

    needs: list[Need]
    need: np.ndarray
    dev: np.ndarray
    sid: np.ndarray
    piece: np.ndarray
    code: np.ndarray
    starts: list[int]
    stops: list[int]
    names: list[tuple[str, str]]
    rel: np.ndarray | None = None  # `code` with the need's position among its tensor's needs
    kinds: list[int] | None = None  # per group: its tensor's kind (`Diff.kinds`), or -1

    @classmethod
    def empty(cls) -> Far:
        z = np.zeros(0, I64)
        return cls([], z, z, z, z, z, [], [], [])


class Atoms:
    """All atoms, one row each: `box` (a box id of the pass), `tensor`, `count` wants starting
    at `start` in `flat` (want ids: rows of `want_dev`, `want_sid`, `want_piece`), `holders`
    (a number into `sets`, the distinct holder tuples).

    Groups are taken in (host, tensor) name order; hosts alike (DP replicas of one stage) have
    equal shape codes, so a group costs a dict lookup by its codes' bytes once one like it
    was cut."""

    def __init__(self, state, far: Far):
        self.s = state
        self.set_of: dict[tuple[int, ...], int] = {}
        self.sets: list[tuple[Holder, ...]] = []
        self.chunks: dict[tuple[Box, int], list[Box]] = {}  # split_box by value: 114 distinct of 11k at 1024 GPUs
        self.disjoint: dict[tuple[Box, ...], bool] = {}
        self.alike: dict[tuple, Cut] = {}  # (tensor kind, itemsize, codes by position in the tensor's needs)
        codes = far.code.tobytes()
        rel = far.rel.tobytes() if far.rel is not None else b""
        number: dict[bytes, int] = {}  # a shape's position in `shapes` by its codes
        shapes: list[Shape] = []
        ids, offsets, tensors = [], [], []
        for g in sorted(range(len(far.names)), key=far.names.__getitem__):
            a, b = far.starts[g], far.stops[g]
            key = codes[8 * a : 8 * b]
            i = number.get(key)
            if i is None:
                kind = far.kinds[g] if far.kinds is not None else -1
                alike = (kind, self.s.size[far.names[g][1]], rel[8 * a : 8 * b]) if kind >= 0 else None
                i = number[key] = len(shapes)
                shapes.append(self.shape_of_kind(far, a, b, alike))
            ids.append(i)
            offsets.append(a)
            tensors.append(state.tensor_ix[far.names[g][1]])
        self.want_dev, self.want_sid, self.want_piece = far.dev, far.sid, far.piece
        # each group's shape taken from the distinct shapes joined once (2.5k at 1024 GPUs), not
        # one concatenate of 18.5k small arrays per column
        at, atoms, wants = np.array(ids, I64), *(np.array([len(s[j]) for s in shapes], I64) for j in (0, 2))
        take = keysort.ranges((np.cumsum(atoms) - atoms)[at], atoms[at])
        self.box, self.count, self.holders = (_cat([s[j] for s in shapes])[take] for j in (0, 1, 3))
        take = keysort.ranges((np.cumsum(wants) - wants)[at], wants[at])
        self.flat = _cat([s[2] for s in shapes])[take] + np.repeat(np.array(offsets, I64), wants[at])
        self.tensor = np.repeat(np.array(tensors, I64), atoms[at])
        self.start = np.cumsum(self.count) - self.count

    def order(self, volume: np.ndarray, itemsize: np.ndarray, lo: np.ndarray, nd: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Atom rows largest bytes first, then by landing device, box start, box stop (the
        tuples' order: a shorter start that is a prefix sorts first, so dims past a box's
        ndim count as -1). Stable, like Python's sort of the rows in this order. Boxes are
        ranked once over the pass's boxes (equal ones alike) and bytes by their distinct
        values, so the atoms sort on one packed key."""
        nbytes = volume[self.box] * itemsize[self.tensor]
        starts = np.where(np.arange(lo.shape[1]) < nd[:, None], lo, -1)
        rows = np.hstack((starts, hi))
        by = np.lexsort(rows.T[::-1]) if len(rows) else np.zeros(0, I64)
        new = np.concatenate(([True], (rows[by][1:] != rows[by][:-1]).any(axis=1))) if len(by) else by
        rank = np.empty(len(by), I64)
        rank[by] = np.cumsum(new) - 1
        size_rank = keysort.unique_first(-nbytes)[2]
        return keysort.lexsort((rank[self.box], self.want_dev[self.flat[self.start]], size_rank))

    def shape_of_kind(self, far: Far, a: int, b: int, alike: tuple | None) -> Shape:
        """The shape of the wants `a:b` of `far`. A group of a tensor of the same kind, size and
        codes by need position as one cut before has needs alike row by row (`Diff.kinds`), so
        its atoms are cut alike (the same boxes, chunks and want order: dst ids of one kind
        order alike); only its holder sets are its own, numbered in the order `cut` meets them."""
        made = self.alike.get(alike) if alike is not None else None
        if made is None:
            made = self.shape(far, a, b)
            if alike is not None:
                self.alike[alike] = made
            return made[0]
        (box, count, flat, _), groups, of = made
        holders = [far.needs[i].holders for i in far.need[a:b].tolist()]
        sets = np.array([self.by_holders([holders[p] for p in ps]) for ps in groups], I64)
        return box, count, flat, sets[of]

    def shape(self, far: Far, a: int, b: int) -> Cut:
        """`cut`'s atoms of the wants `a:b` of `far`: box ids, want counts, want positions
        (from `a`) and holder sets; the want positions of each holder group and each atom's."""
        wants = list(zip(map(far.needs.__getitem__, far.need[a:b].tolist()), far.dev[a:b].tolist()))
        pos = {(id(n), d): i for i, (n, d) in enumerate(wants)}
        atoms, groups = self.cut(wants)
        box = np.array([self.s.box_id(b) for b, _, _, _ in atoms], I64)
        count = np.array([len(ws) for _, ws, _, _ in atoms], I64)
        flat = np.array([pos[(id(n), d)] for _, ws, _, _ in atoms for n, d in ws], I64)
        shape = box, count, flat, np.array([h for _, _, h, _ in atoms], I64)
        return shape, [[pos[(id(n), d)] for n, d in ws] for ws in groups], np.array([k for *_, k in atoms], I64)

    def cut(self, wants: list[Want]) -> tuple[list[tuple[Box, list[Want], int, int]], list[list[Want]]]:
        """Disjoint regions of one tensor needed on one host, each with the wants containing it
        (landing first), their holder set and their group's number, cut to the message size
        limit; and the wants of each group (a box, whose holder set is found once), in the
        order their holder sets are numbered."""
        by_box: dict[Box, list[Want]] = defaultdict(list)
        for w in wants:
            by_box[w[0].box].append(w)
        boxes = tuple(by_box)
        if len(boxes) > 1 and not self.apart(boxes):
            by_box = _refine(by_box)
        limit = max(1, self.s.p.options.max_message_bytes // self.s.size[wants[0][0].tensor])
        out = []
        for k, (box, ws) in enumerate(by_box.items()):
            ws, hosts = sorted(ws, key=_want_order), self.by_holders([n.holders for n, _ in ws])
            chunks = self.chunks.get((box, limit))
            if chunks is None:
                chunks = self.chunks[(box, limit)] = split_box(box, limit)
            out.extend((chunk, ws, hosts, k) for chunk in chunks)
        return out, list(by_box.values())

    def apart(self, boxes: tuple[Box, ...]) -> bool:
        """Whether no two of `boxes` overlap (cached: tensors of one layout have equal boxes)."""
        found = self.disjoint.get(boxes)
        if found is None:
            found = self.disjoint[boxes] = not any(i < j for i, j in overlapping_pairs(boxes, boxes))
        return found

    def by_holders(self, holders: list) -> int:
        """The number in `sets` of the union of the holder tuples `holders` (sorted; one per
        distinct combination of tuples: needs share theirs)."""
        groups = {id(hs): hs for hs in holders}
        key = tuple(sorted(groups))
        number = self.set_of.get(key)
        if number is None:
            one = len(groups) == 1  # one holder tuple, sorted (the common case): no merge
            self.sets.append(holders[0] if one else tuple(sorted({h for hs in groups.values() for h in hs})))
            number = self.set_of[key] = len(self.sets) - 1
        return number

    def copies(self, order: np.ndarray, first_op: int, holders: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[dict, np.ndarray]:
        """Columns of the copies of the atoms in `order` (op ids from `first_op`) whose landing
        copies read `holders` (device, sub-tensor id, piece per atom in that order), and the
        order edges from each landing copy to its forwards."""
        count = self.count[order]
        total = int(count.sum())
        atom = np.repeat(np.arange(len(order)), count)
        head = np.cumsum(count) - count  # op position of each atom's landing copy
        at = np.arange(total) - head[atom]
        want = self.flat[self.start[order][atom] + at]
        landing = at == 0
        lw = want[head][atom]
        cols = {"tensor": self.tensor[order][atom], "box": self.box[order][atom],
                "src_dev": np.where(landing, holders[0][atom], self.want_dev[lw]),
                "src_sid": np.where(landing, holders[1][atom], self.want_sid[lw]),
                "src_piece": np.where(landing, holders[2][atom], self.want_piece[lw]),
                "dst_dev": self.want_dev[want], "dst_sid": self.want_sid[want], "dst_piece": self.want_piece[want],
                "forward": ~landing}  # fmt: skip
        ids = first_op + np.arange(total)
        return cols, np.stack((first_op + head[atom], ids), axis=1)[~landing]


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, I64)


def _want_order(w: Want) -> tuple:
    return (w[1], w[0].dst_subtensor, w[0].dst_piece)


def _refine(by_box: dict[Box, list[Want]]) -> dict[Box, list[Want]]:
    """Disjoint atoms of overlapping need boxes, each listing every want that contains it."""
    atoms: list[tuple[Box, list[Want]]] = []
    for box, wants in by_box.items():
        rest, refined = [box], []
        for a, aws in atoms:
            inter = a.intersect(box)
            if inter is None:
                refined.append((a, aws))
                continue
            refined.append((inter, aws + wants))
            refined.extend((q, aws) for q in a.subtract(inter))
            rest = subtract_all(rest, inter)
        atoms = refined + [(r, list(wants)) for r in rest]
    return dict(sorted(atoms, key=lambda x: x[0]))
