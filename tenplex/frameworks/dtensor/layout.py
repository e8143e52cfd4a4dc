"""DTensor layouts as PTCs (torch-free): one partition per rank, one sub-tensor per (rank, FQN).

A `TensorSpec` is what every rank knows about one logical tensor of a state dict: its FQN
(DCP's flattened key, e.g. `optim.state.0.weight.exp_avg`), global shape, dtype, the mesh it
lives on (shape plus the global ranks at each mesh position, row-major) and its placements.
`ptc_from_specs(world, specs, values)` builds the PTC:

- partition `rank{r}` for each rank r in [0, world), allocated to device r (one host `h0`);
- sub-tensor `{fqn}@rank{r}` (path `fqn`) for each rank in the tensor's mesh: local shape and
  one piece from `local_box` (no piece when the shard is empty: a zero-size local array);
- every partition holds every value name (policy `replicated`, inherited from src).

Invariants:
- world >= 1; a spec's mesh ranks are distinct and in [0, world), prod(mesh shape) of them;
- at most `MAX_SUBTENSORS` sub-tensors in all (about 700 B of memory each, and more to plan
  over): a layout past it is refused before anything is built (`check_subtensor_count`);
- FQNs are unique; values and tensors do not share a name;
- the PTC is complete: each tensor's boxes over its mesh tile it (torch.chunk rule);
- a `LocalShard`'s array has the shape `local_box` gives for its rank's coordinate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs
import numpy as np

from tenplex.frameworks.dtensor.boxes import (
    Placement,
    PlacementError,
    check_mesh,
    coordinate_of,
    local_box,
    normalize,
)
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

MAX_SUBTENSORS = 1 << 22


def check_subtensor_count(count: int, what: str) -> None:
    """Raises PlacementError when `what` would make more than `MAX_SUBTENSORS` sub-tensors."""
    if count > MAX_SUBTENSORS:
        raise PlacementError(f"{what} would make {count} sub-tensors (one per tensor and rank holding it), more than "
                             f"{MAX_SUBTENSORS}: a PTC that large would not fit in memory")  # fmt: skip


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen
class TensorSpec:
    """One logical tensor of a DTensor state dict and its layout (see the module docstring)."""

    meta: TensorMeta
    mesh_shape: tuple[int, ...] = attrs.field(converter=check_mesh)
    placements: tuple[Placement, ...] = attrs.field(converter=tuple)
    mesh_ranks: tuple[int, ...] = attrs.field(converter=_ints, default=())

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "placements", normalize(self.placements, len(self.meta.shape), self.mesh_shape))
        n = math.prod(self.mesh_shape)
        if not self.mesh_ranks:
            object.__setattr__(self, "mesh_ranks", tuple(range(n)))
        ranks = self.mesh_ranks
        if len(ranks) != n or len(set(ranks)) != n or min(ranks) < 0:
            raise PlacementError(f"tensor {self.meta.name!r}: mesh ranks {list(ranks)} are not {n} distinct ranks of mesh shape {list(self.mesh_shape)}")

    @property
    def name(self) -> str:
        return self.meta.name

    def box_of_rank(self, rank: int) -> Box | None:
        """The global box rank `rank` holds, or None when the rank is not in this mesh."""
        try:
            index = self.mesh_ranks.index(rank)
        except ValueError:
            return None
        return local_box(self.meta.shape, self.mesh_shape, self.placements, coordinate_of(index, self.mesh_shape))

    def boxes(self) -> dict[int, Box]:
        """Rank -> global box, for every rank of the mesh."""
        return {r: self.box_of_rank(r) for r in self.mesh_ranks}  # type: ignore[misc]


@attrs.frozen(eq=False)
class LocalShard:
    """What one rank holds of a DTensor, torch-free: its local array (None when the rank is
    outside the mesh) and the layout every rank agrees on. Picklable, so a rank can send it."""

    array: np.ndarray | None
    global_shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str
    mesh_shape: tuple[int, ...] = attrs.field(converter=tuple)
    placements: tuple[Placement, ...] = attrs.field(converter=tuple)
    mesh_ranks: tuple[int, ...] = attrs.field(converter=tuple)
    rank: int

    def __attrs_post_init__(self) -> None:
        if self.array is None:
            return
        if self.rank not in self.mesh_ranks:
            raise PlacementError(f"rank {self.rank} holds an array but is not in mesh ranks {list(self.mesh_ranks)}")
        box = self.spec("?").box_of_rank(self.rank)
        if box is not None and tuple(self.array.shape) != box.shape:
            raise PlacementError(f"rank {self.rank}: local array of shape {tuple(self.array.shape)} but placements {[str(p) for p in self.placements]} on mesh {list(self.mesh_shape)} give {box.shape}")

    @classmethod
    def on_mesh(cls, array: np.ndarray, global_shape: Sequence[int], mesh_shape: Sequence[int],
                placements: Sequence[Placement], rank: int) -> LocalShard:  # fmt: skip
        """A shard of rank `rank` on a row-major mesh of ranks 0..prod(mesh)-1."""
        return cls(array, tuple(global_shape), np.asarray(array).dtype.name, tuple(mesh_shape), tuple(placements),
                   tuple(range(math.prod(mesh_shape))), rank)  # fmt: skip

    def spec(self, fqn: str) -> TensorSpec:
        """The layout of tensor `fqn` that this shard describes."""
        return TensorSpec(TensorMeta(fqn, self.global_shape, self.dtype), self.mesh_shape, self.placements, self.mesh_ranks)


def subtensor_id(fqn: str, rank: int) -> str:
    return f"{fqn}@rank{rank}"


def partition_id(rank: int) -> str:
    return f"rank{rank}"


def rank_of_partition(pid: str) -> int:
    """The rank of partition `rank{r}`. Raises PlacementError for other ids."""
    if not pid.startswith("rank") or not pid[4:].isdigit():
        raise PlacementError(f"partition {pid!r} is not a DTensor rank partition 'rank<r>'")
    return int(pid[4:])


def ptc_from_specs(world: int, specs: Sequence[TensorSpec], values: Iterable[str] = ()) -> PTC:
    """The PTC of a DTensor state dict on `world` ranks (see the module docstring).

    Raises:
        PlacementError: bad world, a mesh rank outside it, duplicate or clashing names."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise PlacementError(f"world size {world!r} must be a positive integer")
    check_subtensor_count(sum(len(s.mesh_ranks) for s in specs), f"{len(specs)} tensors on {world} ranks")
    names = [s.name for s in specs]
    value_names = sorted(set(values))
    clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(value_names)))
    if clash:
        raise PlacementError(f"state dict names {clash[:5]} are used twice (tensors and values need unique FQNs)")
    held: dict[int, list[str]] = {r: [] for r in range(world)}
    subtensors = []
    for spec in specs:
        if max(spec.mesh_ranks) >= world:
            raise PlacementError(f"tensor {spec.name!r}: mesh ranks {list(spec.mesh_ranks)} exceed world size {world}")
        for rank, box in spec.boxes().items():
            sid = subtensor_id(spec.name, rank)
            pieces = (Piece(box, Box.from_shape(box.shape)),) if box.volume else ()
            subtensors.append(SubTensor(sid, spec.name, spec.name, box.shape, pieces))
            held[rank].append(sid)
    partitions = [Partition(partition_id(r), sids, {n: Value() for n in value_names}) for r, sids in held.items()]
    topology = Topology(tuple(Device(r, "h0") for r in range(world)))
    allocation = Allocation({partition_id(r): (r,) for r in range(world)})
    return PTC(tuple(s.meta for s in specs), tuple(subtensors), tuple(partitions), allocation, topology)
