"""The parallelizer's cost model: predicted step time and peak memory per GPU of one (tp, pp, dp).

One training step processes the global batch B of sequences of s tokens as m = B/(dp·b)
micro-batches of b sequences per pipeline, 1F1B schedule, Megatron rank order (TP fastest, then
DP, then PP; rank r on host r // gpus_per_host, hosts filled from their first GPU). P_i is the
number of parameters that one GPU of stage i holds (its TP shard: vocab padded as Megatron
does), L_i its layers, w the model dtype's bytes, F = peak_flops·efficiency.

Time (seconds per step):
- compute per micro-batch of stage i: 6·b·s·(L_i·P_layer + [i last]·P_head) / F (forward 2,
  backward 4 FLOPs per parameter and token; the 6·params·tokens rule of Kaplan et al. 2020;
  embedding lookups cost nothing, the output layer does; attention's s² term is left out);
- TP per micro-batch of stage i: L_i · 4 ring all-reduces (2 forward, 2 backward; Megatron,
  Shoeybi et al. 2019) of b·s·h·w bytes over NVLink; a TP group never spans hosts;
- PP per micro-batch: 2 point-to-point transfers (activation forward, gradient backward) of
  b·s·h·w bytes, over the network when any stage boundary crosses hosts;
- slot = max over stages of (compute + TP + PP); step = (m + pp - 1)·slot + DP, so the bubble is
  (pp - 1)·slot, a fraction (pp - 1)/(m + pp - 1) (Narayanan et al. 2021);
- DP: one ring all-reduce (ZeRO-1: reduce-scatter + all-gather, the same volume) of the
  largest stage's gradients, 2·(dp-1)/dp·P_i·w / bandwidth + 2·(dp-1)·latency, over NVLink
  when every DP group is inside one host, else the network; not overlapped with compute.

Memory (bytes per GPU; the largest stage counts):
- weights P_i·w + gradients P_i·w + Adam state P_i·(4 + 4 + [w < 4]·4) (two fp32 moments and an
  fp32 master copy; the 16 bytes per parameter of mixed-precision Adam, Rajbhandari et al.
  2020), the Adam state divided by dp with ZeRO-1 and absent with optimizer='none';
- activations, Korthikanti et al. 2022 (TP without sequence parallelism):
  per layer a = s·b·h·(10 + 24/tp + 5·heads·s/(h·tp)); stage i keeps min(pp - i, m)
  micro-batches in flight, so L_i·a·min(pp - i, m); with full recomputation only each layer's
  input 2·s·b·h per in-flight micro-batch plus one layer's a; the last stage adds fp32 logits
  4·b·s·V_padded/tp;
- plus `Hardware.reserved_bytes` (CUDA context, NCCL buffers, allocator fragmentation).

Invariants (checked by `check_valid`, which returns the reason a layout is invalid):
- tp·pp·dp equals the device count; the frontend's `fit` accepts the layout (TP divides heads,
  query groups and ffn; the layer split is valid); pp <= num_layers (no empty stage);
- every TP group lies inside one host;
- dp·micro_batch divides the global batch.
"""

from __future__ import annotations

import functools
import math

import attrs

from tenplex.frontends.layout import padded_vocab, shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import Cluster, ParallelConfig, fit
from tenplex.frontends.params import chunk_params, layer_params
from tenplex.frontends.pipeline import Chunk
from tenplex.ir.errors import SpecError
from tenplex.ir.tensor import ITEMSIZE


@attrs.frozen
class Hardware:
    """Per-GPU speeds. Defaults: an A100-80GB in a DGX-class host with one 200 Gb/s NIC per GPU."""

    peak_flops: float = 312e12  # A100 dense bf16/fp16 tensor-core peak (NVIDIA datasheet)
    efficiency: float = 0.5  # achieved fraction of peak: Megatron reports 44-52% (Narayanan et al. 2021)
    nvlink_bandwidth: float = 300e9  # bytes/s per direction (NVLink 3: 600 GB/s both ways)
    network_bandwidth: float = 25e9  # bytes/s per GPU: one 200 Gb/s HDR InfiniBand NIC each
    nvlink_latency: float = 5e-6  # seconds per ring step
    network_latency: float = 20e-6
    reserved_bytes: float = 2e9  # CUDA context, NCCL buffers, allocator fragmentation


@attrs.frozen
class Workload:
    """What one step trains: global batch, micro-batch and sequence length (all in sequences/tokens)."""

    global_batch: int
    micro_batch: int
    seq: int
    zero1: bool = False
    recompute: bool = False


@attrs.frozen
class Memory:
    """Bytes per GPU of the stage that needs the most."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    reserved: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.reserved


@attrs.frozen
class Candidate:
    """One valid (tp, pp, dp) with its predicted step time (split by cause) and memory."""

    tp: int
    pp: int
    dp: int
    stage_layers: tuple[int, ...]
    micro_batches: int
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    memory: Memory
    fits: bool
    dp_network: bool  # the DP all-reduce crosses hosts
    pp_network: bool  # some stage boundary crosses hosts

    @property
    def step_seconds(self) -> float:
        return self.compute_s + self.bubble_s + self.tp_comm_s + self.pp_comm_s + self.dp_comm_s

    @property
    def bubble(self) -> float:
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    @property
    def key(self) -> tuple[float, float, int, int]:
        """Preference order: faster, then less memory, then fewer stages, then smaller tp."""
        return (self.step_seconds, self.memory.total, self.pp, self.tp)

    @property
    def name(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}"


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage: even when pp divides num_layers, else the extra layers go to the middle
    stages first (1, 2, ...), then stage 0, then the last, which also computes the logits."""
    base, extra = divmod(num_layers, pp)
    order = list(range(1, pp - 1)) + [0, pp - 1][: min(pp, 2)]
    counts = [base] * pp
    for stage in order[:extra]:
        counts[stage] += 1
    return tuple(counts)


def parallel_config(model: ModelSpec, tp: int, pp: int, dp: int, zero1: bool = False) -> ParallelConfig:
    """The frontend's config for (tp, pp, dp): an even split, else `split_layers` as stage_layers."""
    even = model.num_layers % pp == 0
    stages = None if even else split_layers(model.num_layers, pp)
    zero = int(zero1 and model.has_optimizer)
    return ParallelConfig(tp=tp, pp=pp, dp=dp, zero=zero, stage_layers=stages)


def _host(rank: int, gpus_per_host: int) -> int:
    return rank // gpus_per_host


def _groups_in_hosts(devices: int, size: int, stride: int, gpus_per_host: int) -> bool:
    """Whether every group of `size` ranks spaced `stride` apart (Megatron order) lies in one host."""
    for first in range(devices):
        if (first // stride) % size:  # not the first member of its group
            continue
        last = first + (size - 1) * stride
        if _host(first, gpus_per_host) != _host(last, gpus_per_host):
            return False
    return True


def check_valid(model: ModelSpec, tp: int, pp: int, dp: int, gpus_per_host: int, workload: Workload) -> str | None:
    """None if (tp, pp, dp) is a valid layout of `model` for the workload, else the reason."""
    devices = tp * pp * dp
    if pp > model.num_layers:
        return f"pp={pp} exceeds num_layers={model.num_layers} (a stage would be empty)"
    try:
        cluster = Cluster(hosts=-(-devices // gpus_per_host), gpus_per_host=gpus_per_host)
        fit(model, parallel_config(model, tp, pp, dp), cluster)
    except SpecError as e:
        return str(e)
    if not _groups_in_hosts(devices, tp, 1, gpus_per_host):
        return f"tp={tp} would put a tensor-parallel group across hosts of {gpus_per_host} GPUs"
    per_step = dp * workload.micro_batch
    if workload.global_batch % per_step:
        return f"dp*micro_batch = {dp}*{workload.micro_batch} = {per_step} does not divide global_batch={workload.global_batch}"
    return None


def _elements(model: ModelSpec, params: list, tp: int) -> int:
    multiple = model.make_vocab_size_divisible_by
    return sum(math.prod(shard(p.shape, p.rule, tp, 0, multiple).shape) for p in params)


@functools.lru_cache(maxsize=512)
def local_params(model: ModelSpec, tp: int, pp: int) -> tuple[int, int, int, int]:
    """Parameters per GPU at this tp: (per layer, stage-0 extras, last-stage extras, output layer)."""
    experts = range(model.num_experts)
    layer = _elements(model, layer_params(model, 0, 0, experts), tp)
    first = Chunk(0, 0, 0, 0, first=True, last=False, prefix="model")
    last = Chunk(pp - 1, 0, 0, 0, first=False, last=True, prefix="model")
    extras_first = _elements(model, chunk_params(model, first, pp, experts), tp)
    extras_last = _elements(model, chunk_params(model, last, pp, experts), tp)
    head = padded_vocab(model.vocab, tp, model.make_vocab_size_divisible_by) // tp * model.hidden
    return layer, extras_first, extras_last, head


def _allreduce(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def _stage_params(model: ModelSpec, tp: int, layers: tuple[int, ...]) -> list[int]:
    layer, first, last, _ = local_params(model, tp, len(layers))
    counts = [n * layer for n in layers]
    counts[0] += first
    counts[-1] += last
    return counts


def stage_memory(model: ModelSpec, tp: int, layers: tuple[int, ...], dp: int, w: Workload, hw: Hardware) -> Memory:
    """The peak memory per GPU over the stages."""
    pp, m, s, b, h = len(layers), w.global_batch // (dp * w.micro_batch), w.seq, w.micro_batch, model.hidden
    item = ITEMSIZE[model.dtype]
    adam = (8 + (4 if item < 4 else 0)) / (dp if w.zero1 else 1) if model.has_optimizer else 0
    per_layer = s * b * h * (10 + 24 / tp + 5 * model.heads * s / (h * tp))
    logits = 4 * b * s * padded_vocab(model.vocab, tp, model.make_vocab_size_divisible_by) / tp
    stages = []
    for i, (n, params) in enumerate(zip(layers, _stage_params(model, tp, layers))):
        inflight = min(pp - i, m)
        acts = n * per_layer * inflight if not w.recompute else n * 2 * s * b * h * inflight + per_layer
        acts += logits if i == pp - 1 else 0
        stages.append(Memory(params * item, params * item, params * adam, acts, hw.reserved_bytes))
    return max(stages, key=lambda mem: mem.total)


def evaluate(
    model: ModelSpec, tp: int, pp: int, dp: int, gpus_per_host: int, w: Workload, hw: Hardware, memory_per_gpu: float
) -> Candidate:
    """The predicted step time and memory of a layout that `check_valid` accepted."""
    devices, layers = tp * pp * dp, split_layers(model.num_layers, pp)
    m, tokens, item = w.global_batch // (dp * w.micro_batch), w.micro_batch * w.seq, ITEMSIZE[model.dtype]
    layer, _, _, head = local_params(model, tp, pp)
    flops = hw.peak_flops * hw.efficiency
    act_bytes = tokens * model.hidden * item
    pp_network = pp > 1 and not _groups_in_hosts(devices, pp, tp * dp, gpus_per_host)
    p2p = 0.0
    if pp > 1:
        bw, lat = (hw.network_bandwidth, hw.network_latency) if pp_network else (hw.nvlink_bandwidth, hw.nvlink_latency)
        p2p = 2 * (act_bytes / bw + lat)
    tp_layer = 4 * _allreduce(act_bytes, tp, hw.nvlink_bandwidth, hw.nvlink_latency)
    slots = [
        (6 * tokens * (n * layer + (head if i == pp - 1 else 0)) / flops, n * tp_layer) for i, n in enumerate(layers)
    ]
    compute, tp_comm = max(slots, key=sum)
    dp_network = not _groups_in_hosts(devices, dp, tp, gpus_per_host)
    bw, lat = (hw.network_bandwidth, hw.network_latency) if dp_network else (hw.nvlink_bandwidth, hw.nvlink_latency)
    grads = max(_stage_params(model, tp, layers)) * item
    memory = stage_memory(model, tp, layers, dp, w, hw)
    return Candidate(
        tp=tp,
        pp=pp,
        dp=dp,
        stage_layers=layers,
        micro_batches=m,
        compute_s=m * compute,
        bubble_s=(pp - 1) * (compute + tp_comm + p2p),
        tp_comm_s=m * tp_comm,
        pp_comm_s=m * p2p,
        dp_comm_s=_allreduce(grads, dp, bw, lat),
        memory=memory,
        fits=memory.total <= memory_per_gpu,
        dp_network=dp_network,
        pp_network=pp_network,
    )


def layouts(devices: int) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) with tp·pp·dp = devices, by tp then pp."""
    return [
        (tp, pp, devices // (tp * pp))
        for tp in range(1, devices + 1)
        if devices % tp == 0
        for pp in range(1, devices // tp + 1)
        if (devices // tp) % pp == 0
    ]
