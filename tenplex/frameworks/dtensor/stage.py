"""Pipeline stages in a dst layout: the `Stage(s)` placement and the sub-mesh it selects (torch-free).

A layout (`dtensor.mesh`) may write `"Stage(s)"` for a mesh dim instead of a DTensor placement:
the tensor lives only on the mesh slice whose coordinate along that dim is `s`, and the rule's
other placements apply within that slice. It is how a pipeline-parallel job says "this
parameter is held by the ranks of stage s only". On mesh `[2, 1, 2]` (pp, dp, tp) the rule
`["Stage(1)", "R", "S(0)"]` puts a tensor on ranks 2 and 3, dim 0 split between them.

`stage_slice(key, mesh, placements)` turns a rule into what `TensorSpec` takes: the slice's
mesh shape (the non-Stage dims, in order), their placements, and the slice's global ranks in
row-major order. A rule may stage several dims; a rule that stages every dim selects one rank
(mesh `[1]`, `Replicate`).

Stage is a layout-file concept only: `dtensor.boxes.parse_placement`, which also reads torch's
own placements, does not accept it.

Invariants:
- the text is exactly `Stage(s)` (case-sensitive) with `s` an integer >= 0;
- `s` lies inside its mesh dim (`s < mesh[dim]`), checked against the layout's mesh.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence

import attrs

from tenplex.frameworks.dtensor.boxes import Placement, PlacementError, Replicate, coordinates, parse_placement


def _index(value: object) -> int:
    try:
        index = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        index = -1
    if isinstance(value, bool) or index < 0:
        raise PlacementError(f"stage index {value!r} is not an integer >= 0")
    return index


@attrs.frozen
class Stage:
    """The tensor lives only on the mesh slice at coordinate `index` of one mesh dim."""

    index: int = attrs.field(converter=_index)

    def __str__(self) -> str:
        return f"Stage({self.index})"


LayoutPlacement = Placement | Stage
_STAGE = re.compile(r"^Stage\((\d+)\)$")


def parse_layout_placement(text: str) -> LayoutPlacement:
    """`"Stage(s)"` → `Stage(s)`; anything else as `parse_placement` reads it.

    Raises:
        PlacementError: a negative stage, `Stage` spelt otherwise, or an unknown placement."""
    if not isinstance(text, str):
        return parse_placement(text)
    s = text.strip()
    m = _STAGE.match(s)
    if m:
        return Stage(int(m.group(1)))
    if s.lower().startswith("stage"):
        raise PlacementError(f"placement {text!r} is not Stage(s) with s an integer >= 0 (spelt exactly 'Stage(1)')")
    try:
        return parse_placement(text)
    except PlacementError:
        raise PlacementError(f"placement {text!r} is not Shard(d) ('S(d)'), Replicate ('R') or Stage(s)") from None


def check_stages(key: str, mesh: Sequence[int], placements: Sequence[LayoutPlacement]) -> None:
    """Raises PlacementError naming `key` and the mesh when a Stage lies outside its mesh dim."""
    for dim, p in enumerate(placements):
        if isinstance(p, Stage) and p.index >= mesh[dim]:
            raise PlacementError(f"layout placements[{key!r}] = {[str(q) for q in placements]}: {p} is outside mesh dim {dim} "
                                 f"of size {mesh[dim]} (mesh {list(mesh)})")  # fmt: skip


def stage_slice(key: str, mesh: Sequence[int], placements: Sequence[LayoutPlacement]) -> tuple[tuple[int, ...], tuple[Placement, ...], tuple[int, ...]]:
    """(mesh shape, placements, global ranks) of the slice `placements` select (see above).

    Raises:
        PlacementError: a Stage outside its mesh dim (names `key` and the mesh)."""
    check_stages(key, mesh, placements)
    staged = {dim: p.index for dim, p in enumerate(placements) if isinstance(p, Stage)}
    ranks = tuple(r for r, c in enumerate(coordinates(mesh)) if all(c[d] == s for d, s in staged.items()))
    kept = [(m, p) for dim, (m, p) in enumerate(zip(mesh, placements)) if dim not in staged]
    if not kept:
        return (1,), (Replicate(),), ranks
    return tuple(m for m, _ in kept), tuple(p for _, p in kept if not isinstance(p, Stage)), ranks
