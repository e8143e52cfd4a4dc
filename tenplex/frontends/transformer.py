"""Model spec + parallel config + cluster -> the exact per-rank PTC of a Megatron-style job.

Partitions (one per rank's state dict; several devices = DP replicas):
- `pp{p}-tp{t}` (`pp{p}-tp{t}-ep{e}` with EP > 1): the model parameters of that (PP, TP[, EP])
  coordinate and, with zero=0, their Adam state; allocated to the devices of every DP rank d
  with `d % ep == e`. Values: `iteration` (replicated, None = inherit from src) and `rng`
  (per-rank seed offsets: 100·pp, 2718 + tp, and 1024 + 100·ep + tp with EP).
- `pp{p}-tp{t}-dp{d}` (zero=1 only): DP rank d's fragments of the distributed optimizer's
  flat buffers, on that rank's device alone.

Sub-tensor ids are `<partition>/<label>` for parameters and `<partition>/optim.<kind>/<label>`
for optimizer state; paths are the Megatron legacy keys under the chunk (`model`, `model{v}`).
Tied embeddings with PP > 1 put a second holder of `embedding.word_embeddings.weight` (and of
its optimizer state) on the last stage, labelled `word_embeddings_for_head.weight`.
Sequence parallelism does not change the parameter layout (Megatron); it is kept in the
ParallelConfig only.

Invariants: the PTC is complete (every tensor element is held by some sub-tensor), which
`check_complete` verifies in tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tenplex.frontends.layout import shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.optimizer import fragment_subtensors, optim_kinds, optim_subtensors, optim_tensor, stage_buffers
from tenplex.frontends.parallel import Cluster, ParallelConfig, fit
from tenplex.frontends.params import Param, chunk_params
from tenplex.frontends.pipeline import Chunk, chunks
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import SubTensor, TensorMeta

Stage = list[tuple[Chunk, list[Param]]]


def expert_range(model: ModelSpec, ep: int, ep_rank: int) -> range:
    """Global ids of the experts that EP rank `ep_rank` holds."""
    n = model.num_experts // ep
    return range(ep_rank * n, (ep_rank + 1) * n)


def stage_params(model: ModelSpec, parallel: ParallelConfig, pp: int, ep_rank: int = 0) -> Stage:
    """(chunk, parameters) of every virtual chunk of PP rank `pp`, as EP rank `ep_rank` holds them."""
    experts = expert_range(model, parallel.ep, ep_rank)
    return [(c, chunk_params(model, c, parallel.pp, experts)) for c in chunks(model.num_layers, parallel) if c.pp == pp]


def model_partition_id(parallel: ParallelConfig, pp: int, tp: int, ep_rank: int = 0) -> str:
    return f"pp{pp}-tp{tp}" + (f"-ep{ep_rank}" if parallel.ep > 1 else "")


def _rng(parallel: ParallelConfig, pp: int, tp: int, ep_rank: int) -> Value:
    seeds = {"seed_offset": 100 * pp, "model_parallel_seed_offset": 2718 + tp}
    if parallel.ep > 1:
        seeds["expert_parallel_seed_offset"] = 1024 + 100 * ep_rank + tp
    return Value(seeds, "per-rank")


class _Collector:
    """Accumulates tensors, sub-tensors, partitions and the allocation of one PTC."""

    def __init__(self, model: ModelSpec, parallel: ParallelConfig, cluster: Cluster):
        self.model, self.parallel, self.cluster = model, parallel, cluster
        self.tensors: dict[str, TensorMeta] = {}
        self.subtensors: list[SubTensor] = []
        self.partitions: list[Partition] = []
        self.allocation: dict[str, tuple[int, ...]] = {}

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        if name not in self.tensors:
            self.tensors[name] = TensorMeta(name, shape, dtype)

    def partition(self, pid: str, subs: Iterable[SubTensor], devices: Sequence[int], values: dict[str, Value]) -> None:
        subs = list(subs)
        self.subtensors += subs
        self.partitions.append(Partition(pid, tuple(s.id for s in subs), values))
        self.allocation[pid] = tuple(devices)

    def devices(self, pp: int, tp: int, dp_ranks: Iterable[int]) -> list[int]:
        return [self.cluster.device(self.parallel.rank(pp, d, tp)) for d in dp_ranks]

    def model_partition(self, stage: Stage, pp: int, tp: int, ep_rank: int) -> None:
        model, par = self.model, self.parallel
        pid = model_partition_id(par, pp, tp, ep_rank)
        subs: list[SubTensor] = []
        for chunk, params in stage:
            for param in params:
                layout = shard(param.shape, param.rule, par.tp, tp, model.make_vocab_size_divisible_by)
                subs.append(
                    SubTensor(
                        f"{pid}/{param.label}", param.name, f"{chunk.prefix}/{param.key}", layout.shape, layout.pieces
                    )
                )
                if not par.zero:
                    subs += optim_subtensors(model, pid, param, layout)
        values = {"iteration": Value(None, "replicated"), "rng": _rng(par, pp, tp, ep_rank)}
        self.partition(pid, subs, self.devices(pp, tp, range(ep_rank, par.dp, par.ep)), values)

    def register(self, stage: Stage) -> None:
        for _, params in stage:
            for p in params:
                self.tensor(p.name, p.shape, self.model.dtype)
                for kind in optim_kinds(self.model):
                    self.tensor(optim_tensor(kind, p.name), p.shape, "float32")

    def ptc(self) -> PTC:
        return PTC(
            tuple(self.tensors.values()),
            tuple(self.subtensors),
            tuple(self.partitions),
            Allocation(self.allocation),
            self.cluster.topology(),
        )


def build_ptc(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> PTC:
    """The PTC of `model` trained with `parallel` on the first tp·pp·dp devices of `cluster`.

    Raises:
        SpecError: the configuration does not fit the model or the cluster (see `fit`).
    """
    par = fit(model, parallel, cluster)
    out = _Collector(model, par, cluster)
    for pp in range(par.pp):
        stages = [stage_params(model, par, pp, e) for e in range(par.ep)]
        for e, stage in enumerate(stages):
            out.register(stage)
            for tp in range(par.tp):
                out.model_partition(stage, pp, tp, e)
        if par.zero:
            buffers = [stage_buffers(model, stage, par.tp, par.dp, par.ep) for stage in stages]
            for tp in range(par.tp):
                for d in range(par.dp):
                    pid = f"pp{pp}-tp{tp}-dp{d}"
                    subs = fragment_subtensors(model, pid, buffers[d % par.ep], par.tp, tp, d, par.ep)
                    out.partition(pid, subs, out.devices(pp, tp, [d]), {})
    return out.ptc()
