"""ZeRO-1/2 flat partitions (docs/conventions.md §4.3): where each parameter's elements lie.

A param group's trainable parameters are flattened in group order (the order of the model
file's `param_shapes`), the flat group is padded at the end to a multiple of `2·DP` elements
(`nccl_start_alignment_factor` 2), and cut into DP equal contiguous partitions; DP rank r owns
partition r. Padding can cover several trailing ranks. A rank saves its fp32 partition with the
padding stripped (`single_partition_of_fp32_groups`), its Adam moments with it (the inner
optimizer's state), and `param_slice_mappings`: for each parameter with elements in the
partition, `fragment_address(numel, start)`, `start` being the offset in the partition.

Worked example: A (35), B (7), C (21), D (3), DP 2 -> 66 elements padded to 68, partitions of
34: rank 0 holds A[0:34]; rank 1 holds A[34:35] at 0, B at 1, C at 8, D at 29, then 2 padding
elements (its `param_slice_mappings`: A (1, 0), B (7, 1), C (21, 8), D (3, 29)).

Invariants: partitions are disjoint, equal-sized, cover [0, padded); a rank's fragments are in
flat order and contiguous from offset 0; `valid(r) + padding(r) == partition size`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs

ALIGN = 2  # nccl_start_alignment_factor


@attrs.frozen
class Fragment:
    """Elements [start, stop) of parameter `name`, at `offset` in the rank's partition."""

    name: str
    start: int
    stop: int
    offset: int


@attrs.frozen
class FlatGroup:
    """One param group: (name, numel) in flat order, partitioned over `dp` ranks."""

    params: tuple[tuple[str, int], ...] = attrs.field(converter=tuple)
    dp: int

    @property
    def numel(self) -> int:
        return sum(n for _, n in self.params)

    @property
    def partition_size(self) -> int:
        step = ALIGN * self.dp
        return -(-self.numel // step) * step // self.dp

    def valid(self, rank: int) -> int:
        """Elements of rank `rank`'s partition that are not padding."""
        size = self.partition_size
        return max(0, min(size, self.numel - rank * size))

    def padding(self, rank: int) -> int:
        return self.partition_size - self.valid(rank)

    def fragments(self, rank: int) -> Iterator[Fragment]:
        """The parameter fragments rank `rank` holds, in flat order."""
        lo = rank * self.partition_size
        hi = lo + self.valid(rank)
        at = 0
        for name, n in self.params:
            a, b = max(at, lo), min(at + n, hi)
            if a < b:
                yield Fragment(name, a - at, b - at, a - lo)
            at += n


def groups_for(shapes: Sequence[Sequence[tuple[str, int]]], dp: int) -> tuple[FlatGroup, ...]:
    return tuple(FlatGroup(tuple(g), dp) for g in shapes)
