"""A need's holders as int columns, and the diff's registry that gives many sets' rows at once.

The diff lists every holder of every need (296k at 1024 GPUs: each DP replica of each src
piece), and select-sources reads them back as int rows (device, src sub-tensor number, piece).
As `Holder` objects that was ~0.3 CPU s of building and reading; as `HolderRows` put from a
tensor kind's template (`diff._Kinds`), a holder set is one small object and the rows of all
sets come out of numpy (`holder_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from operator import attrgetter, itemgetter

import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.ops import Holder, as_holder

I64 = np.int64
_KEY = attrgetter("key")
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


class HolderRows:
    """Holders as int columns: `devices`, src sub-tensor `numbers` (positions in the src PTC's
    sub-tensor order, whose ids are `names`) and `pieces`, one row per holder, in sorted holder
    order. A `Need`'s holders without one `Holder` object per row (the diff makes 296k at 1024
    GPUs; select-sources reads the columns): it reads, compares and hashes as the tuple of
    `Holder`s it stands for, which it builds when iterated or indexed. The diff's rows are
    a template's (`devices`, positions `at` among a tensor's src sub-tensors, `pieces`) put on
    one tensor (`base`: its sub-tensors' numbers); `key` (registry, template number, tensor
    number) lets the registry give many sets' rows at once.

    Invariant: `tuple(self)` is sorted, and `names[numbers[i]]` is row i's sub-tensor id."""

    __slots__ = ("devices", "at", "pieces", "base", "names", "key")

    def __init__(self, devices: tuple[int, ...], at: tuple[int, ...], pieces: tuple[int, ...], base: Sequence[int],
                 names: Sequence[str], key: tuple = ()):  # fmt: skip
        self.devices, self.at, self.pieces, self.base, self.names, self.key = devices, at, pieces, base, names, key

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(map(self.base.__getitem__, self.at))

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[Holder]:
        return map(as_holder, zip(self.devices, map(self.names.__getitem__, self.numbers), self.pieces))

    def __getitem__(self, i):
        return tuple(self)[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HolderRows | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class HolderSets:
    """The diff's holder templates (devices, positions among a tensor's src sub-tensors,
    pieces) and the tensors they were put on (their src sub-tensors' numbers), numbered in
    the order they are added; `rows` gives the rows of many (template, tensor) sets by numpy."""

    def __init__(self, names: Sequence[str]):
        self.names = names
        self.templates: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
        self.bases: list[tuple[int, ...]] = []
        self._cols: tuple | None = None

    def add_template(self, sets: list[tuple]) -> int:
        """Number the holder templates `sets`; returns the first number."""
        self.templates.extend(sets)
        self._cols = None
        return len(self.templates) - len(sets)

    def put(self, first: int, count: int, base: tuple[int, ...]) -> list[HolderRows]:
        """Templates `first` .. `first + count - 1` put on a tensor whose src sub-tensors have
        the numbers `base`."""
        t = len(self.bases)
        self.bases.append(base)
        self._cols = None
        return [HolderRows(ds, ks, pieces, base, self.names, (self, g, t))
                for g, (ds, ks, pieces) in enumerate(self.templates[first : first + count], first)]  # fmt: skip

    def rows(self, g: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, rows (device, src sub-tensor number, piece)) of the sets (template
        `g[i]`, tensor `t[i]`), in turn."""
        lens_t, off_t, dev, at, piece, off_b, base = self._columns()
        lens = lens_t[g]
        idx = keysort.ranges(off_t[g], lens)
        out = np.empty((len(idx), 3), I64)
        out[:, 0], out[:, 2] = dev[idx], piece[idx]
        out[:, 1] = base[np.repeat(off_b[t], lens) + at[idx]]
        return lens, out

    def _columns(self) -> tuple:
        if self._cols is None:
            lens = np.fromiter(map(len, map(_FIRST, self.templates)), I64, len(self.templates))
            blens = np.fromiter(map(len, self.bases), I64, len(self.bases))
            flat = [np.fromiter(chain.from_iterable(map(get, self.templates)), I64, int(lens.sum()))
                    for get in (_FIRST, _SECOND, _THIRD)]  # fmt: skip
            base = np.fromiter(chain.from_iterable(self.bases), I64, int(blens.sum()))
            self._cols = (lens, np.cumsum(lens) - lens, *flat, np.cumsum(blens) - blens, base)
        return self._cols


def holder_rows(sets: list, sid_ix: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(the length of each holder set, rows (device, sub-tensor id, piece) of all their
    holders in order). Sets that are all `HolderRows` of one registry come from it by numpy
    (their sub-tensor numbers are positions in the src PTC's order, which `sid_ix` numbers
    first, so they are its ids); otherwise each set is read on its own."""
    keys = [getattr(hs, "key", ()) for hs in sets]
    if sets and all(keys) and all(k[0] is keys[0][0] for k in keys):
        g = np.fromiter(map(_SECOND, keys), I64, len(keys))
        return keys[0][0].rows(g, np.fromiter(map(_THIRD, keys), I64, len(keys)))
    cols = [_columns(hs, sid_ix) for hs in sets]
    lens = np.fromiter(map(len, map(_FIRST, cols)), I64, len(cols))
    n = int(lens.sum())
    out = np.empty((n, 3), I64)
    for j, get in enumerate((_FIRST, _SECOND, _THIRD)):
        out[:, j] = np.fromiter(chain.from_iterable(map(get, cols)), I64, n)
    return lens, out


def _columns(hs, sid_ix: dict[str, int]) -> tuple:
    if type(hs) is HolderRows:
        return hs.devices, hs.numbers, hs.pieces
    return tuple(h[0] for h in hs), tuple(sid_ix[h[1]] for h in hs), tuple(h[2] for h in hs)
