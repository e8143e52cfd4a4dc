"""What a Megatron checkpoint holds besides its tensors, and the read result.

`MegatronMeta` carries everything the writer needs that the PTC does not say: the model and
layout (from `args`), the key naming, the args Namespace itself, the checkpoint version, the
top-level key order and the entries copied verbatim (opt_param_scheduler,
num_floating_point_operations_so_far, rerun_state_machine, ...), the optimizer's param-group
templates, and the shape of the RNG state (its values are re-derived, never carried).

`MegatronCheckpoint` unpacks as the triple `(ptc, arrays, values)` of
`tenplex.runtime.checkpoint.directory.read_checkpoint`; `.meta` rides along.

Invariants: `ptc` is `build_ptc(meta.model, meta.parallel, meta.cluster)`; `arrays` has one
array per sub-tensor, of its local shape and its tensor's dtype; `values` has the PTC's value
names per partition (`iteration` from the files, `rng` the frontend's per-rank offsets).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.megatron.names import Naming
from tenplex.frameworks.megatron.optim import Groups
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import Cluster, ParallelConfig
from tenplex.ir.ptc import PTC


@attrs.frozen(eq=False)
class MegatronMeta:
    model: ModelSpec
    parallel: ParallelConfig  # fitted: dp is set
    naming: Naming
    args: argparse.Namespace
    checkpoint_version: float = 3.0
    release: bool = False
    top: tuple[str, ...] = ("args", "checkpoint_version", "iteration", "model", "optimizer", "rng_state")
    copied: tuple[tuple[str, Any], ...] = ()  # top-level entries written back verbatim
    extra_modules: frozenset[str] = frozenset()  # mcore modules saving `_extra_state`
    groups: Groups | None = None  # None without optimizer state
    group_rule: tuple[bool, ...] | None = None  # a fixed group class order, None = first appearance
    dtype_key: Any = None  # the distributed optimizer's buffer key, as read
    rng: tuple[tuple[str, ...], tuple[str, ...], int] | None = None  # (entry keys, trackers, CUDA state bytes)
    vocab_known: bool = True  # False when the true vocabulary size was not in args

    @property
    def cluster(self) -> Cluster:
        return cluster_for(self.parallel)

    def with_layout(self, parallel: ParallelConfig) -> MegatronMeta:
        """This meta for another (fitted) layout of the same model."""
        return attrs.evolve(self, parallel=parallel)


def cluster_for(parallel: ParallelConfig) -> Cluster:
    """One host holding every rank of `parallel` (dp given)."""
    return Cluster(1, parallel.tp * parallel.pp * (parallel.dp or 1))


@attrs.frozen(eq=False)
class MegatronCheckpoint:
    """A read checkpoint; `ptc, arrays, values = checkpoint` as with `read_checkpoint`."""

    ptc: PTC
    arrays: dict[str, np.ndarray]
    values: dict[str, dict[str, Any]]
    meta: MegatronMeta

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ptc, self.arrays, self.values))
