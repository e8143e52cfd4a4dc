"""Parallel configurations, clusters, and Megatron's rank order.

Rank order is Megatron's: TP fastest, then DP, then PP, so
`rank = pp·(dp·tp) + dp_rank·tp + tp_rank`, and rank r runs on device `cluster.first_device + r`
(hosts fill in order). The expert-parallel rank of a DP rank is `dp_rank % ep`.

Invariants of `ParallelConfig` (SpecError quoting the values):
- tp, pp, vpp, ep >= 1; dp is None (= fill the cluster) or >= 1; zero is 0 or 1; each of them
  (and a cluster's hosts, GPUs per host and devices) is at most `MAX_DEVICES` (2**20), and
  device ids stay below `MAX_DEVICE_ID` (2**40);
- vpp > 1 needs pp > 1 and an even layer split;
- an uneven split is either first/last stage counts (needs pp > 1) or explicit `stage_layers`
  with one non-negative count per stage, never both.

`fit(model, parallel, cluster)` adds the checks that need the model and the cluster (TP divides
heads, query groups (or the QKV rows when tp > query groups, as mcore >= 0.16), ffn; the
layers split; EP divides dp and the experts; the ranks fit the devices; the PTC would have at
most `MAX_SUBTENSORS` sub-tensors, by `estimated_subtensors`) and fills in dp. So a spec too
large to build fails in milliseconds, before anything is built.
"""

from __future__ import annotations

import attrs

from tenplex.frontends.model import LIMITS, ModelSpec
from tenplex.ir.errors import SpecError
from tenplex.ir.topology import Device, Topology

MAX_DEVICES = 1 << 20
MAX_DEVICE_ID = 1 << 40
LAYER_LIMIT = LIMITS["num_layers"]
MAX_SUBTENSORS = 1 << 21  # ~40x gpt-175b on 4096 GPUs with zero1 (54k); about a minute to build


def _count(field: str, value: object, low: int = 1, high: int = MAX_DEVICES) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(f"{field}={value!r} must be an integer >= {low}")
    if value > high:
        raise SpecError(f"{field}={value} exceeds the limit {high}")


def _counts(values: object) -> tuple[int, ...] | None:
    if values is None:
        return None
    if not isinstance(values, (list, tuple)):
        raise SpecError(f"stage_layers={values!r} must be a list of per-stage layer counts")
    return tuple(values)


@attrs.frozen
class ParallelConfig:
    """(TP, PP, DP, VPP, ZeRO, EP, SP) plus an optional uneven pipeline split."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    vpp: int = 1
    zero: int = 0
    ep: int = 1
    sp: bool = False
    first: int | None = None
    last: int | None = None
    stage_layers: tuple[int, ...] | None = attrs.field(default=None, converter=_counts)
    order: str = "tp-dp-pp"  # rank order, fastest-varying first (Megatron's by default)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.order, str) or sorted(self.order.split("-")) != ["dp", "pp", "tp"]:
            raise SpecError(f"order={self.order!r} must name tp, dp and pp once each, fastest first (e.g. tp-dp-pp)")
        for field in ("tp", "pp", "vpp", "ep"):
            _count(field, getattr(self, field))
        if self.dp is not None:
            _count("dp", self.dp)
        if self.zero not in (0, 1) or isinstance(self.zero, bool):
            raise SpecError(f"zero={self.zero!r} must be 0 or 1 (1 = Megatron distributed optimizer)")
        if not isinstance(self.sp, bool):
            raise SpecError(f"sp={self.sp!r} must be a boolean")
        self._verify_split()

    def _verify_split(self) -> None:
        uneven = self.first is not None or self.last is not None
        if uneven and self.stage_layers is not None:
            raise SpecError("give either first/last stage layer counts or stage_layers, not both")
        if uneven and self.pp == 1:
            raise SpecError(f"first={self.first}, last={self.last} need pp > 1, got pp=1")
        for field in ("first", "last"):
            if getattr(self, field) is not None:
                _count(field, getattr(self, field), 0, LAYER_LIMIT)
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.pp:
                raise SpecError(
                    f"stage_layers={list(self.stage_layers)} has {len(self.stage_layers)} stages but pp={self.pp}"
                )
            for n in self.stage_layers:
                _count("stage_layers entry", n, 0, LAYER_LIMIT)
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(f"vpp={self.vpp} needs pp > 1, got pp=1")
        if self.vpp > 1 and (uneven or self.stage_layers is not None):
            raise SpecError(f"vpp={self.vpp} is supported only with an even layer split")

    @property
    def uneven(self) -> bool:
        return self.first is not None or self.last is not None or self.stage_layers is not None

    @property
    def world(self) -> int:
        if self.dp is None:
            raise SpecError("dp is not resolved yet; call fit(model, parallel, cluster)")
        return self.tp * self.pp * self.dp

    def rank(self, pp: int, dp: int, tp: int) -> int:
        """Global rank of (pp, dp, tp) in `order` (Megatron's: TP fastest, then DP, then PP)."""
        index = {"tp": tp, "dp": dp, "pp": pp}
        size = {"tp": self.tp, "dp": self.world // (self.tp * self.pp), "pp": self.pp}
        rank, stride = 0, 1
        for axis in self.order.split("-"):
            rank += index[axis] * stride
            stride *= size[axis]
        return rank

    def __str__(self) -> str:
        """Canonical spec options, e.g. `tp2,pp2,dp2,vpp2,zero1`."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"] + ([f"dp{self.dp}"] if self.dp is not None else [])
        parts += [f"vpp{self.vpp}"] * (self.vpp > 1) + [f"ep{self.ep}"] * (self.ep > 1)
        parts += ["zero1"] * self.zero + ["sp"] * self.sp
        parts += [f"first={self.first}"] * (self.first is not None) + [f"last={self.last}"] * (self.last is not None)
        if self.stage_layers is not None:
            parts.append("stages=" + "/".join(map(str, self.stage_layers)))
        parts += [f"order={self.order}"] * (self.order != "tp-dp-pp")
        return ",".join(parts)


@attrs.frozen
class Cluster:
    """`hosts` hosts of `gpus_per_host` devices; device ids are consecutive from `first_device`
    (default `first_host·gpus_per_host`) and hosts are named `h{first_host}`, `h{first_host+1}`, ..."""

    hosts: int
    gpus_per_host: int
    first_host: int = 0
    first_device: int = attrs.field(default=attrs.Factory(lambda s: s.first_host * s.gpus_per_host, takes_self=True))

    def __attrs_post_init__(self) -> None:
        _count("hosts", self.hosts)
        _count("gpus_per_host", self.gpus_per_host)
        _count("devices (hosts*gpus_per_host)", self.hosts * self.gpus_per_host)
        _count("first_host", self.first_host, 0)
        _count("first_device", self.first_device, 0, MAX_DEVICE_ID - self.size)

    @property
    def size(self) -> int:
        return self.hosts * self.gpus_per_host

    def device(self, rank: int) -> int:
        return self.first_device + rank

    def topology(self) -> Topology:
        return Topology(
            tuple(
                Device(self.first_device + i, f"h{self.first_host + i // self.gpus_per_host}") for i in range(self.size)
            )
        )

    def __str__(self) -> str:
        return f"{self.hosts}x{self.gpus_per_host}" + (f"+{self.first_host}" if self.first_host else "")


def fit(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> ParallelConfig:
    """`parallel` with dp filled in, after every check that needs the model or the cluster.

    Raises:
        SpecError: naming the sizes that do not divide or do not fit.
    """
    _check_tp(model, parallel.tp)
    _check_layers(model.num_layers, parallel)
    dp = _fit_dp(parallel, cluster)
    _check_ep(model, parallel.ep, dp)
    if parallel.zero and not model.has_optimizer:
        raise SpecError("zero=1 shards optimizer state, but the model has optimizer='none'")
    fitted = attrs.evolve(parallel, dp=dp)
    n = estimated_subtensors(model, fitted)
    if n > MAX_SUBTENSORS:
        raise SpecError(f"the PTC would have about {n} sub-tensors, over the limit {MAX_SUBTENSORS} (fewer layers, ranks or experts)")
    return fitted


def estimated_subtensors(model: ModelSpec, parallel: ParallelConfig) -> int:
    """An upper estimate of the sub-tensors `build_ptc` makes (within ~3x), from sizes alone:
    per model partition ((tp, pp, ep) coordinate) its stage's parameters with their optimizer
    state; with zero=1, the optimizer state as fragments of flat buffers (one per parameter and
    one more per DP cut)."""
    experts = model.num_experts // parallel.ep if model.num_experts else 0
    per_layer = 12 + (1 + 4 * experts if model.num_experts else 0)
    per_stage = -(-model.num_layers // parallel.pp) * per_layer + 10  # + embeddings, heads, norms
    kinds = 3 if model.has_optimizer else 0
    dp = parallel.dp or 1
    partitions = parallel.tp * parallel.pp * parallel.ep
    if parallel.zero:
        return partitions * per_stage + parallel.tp * parallel.pp * kinds * (per_stage * parallel.ep + dp)
    return partitions * per_stage * (1 + kinds)


def _fit_dp(parallel: ParallelConfig, cluster: Cluster) -> int:
    tp, pp, dp = parallel.tp, parallel.pp, parallel.dp
    where = f"{cluster.size} devices ({cluster.hosts} hosts x {cluster.gpus_per_host} GPUs)"
    if dp is None:
        if tp * pp > cluster.size:
            raise SpecError(f"tp*pp = {tp}*{pp} = {tp * pp} ranks do not fit {where}")
        return cluster.size // (tp * pp)
    if tp * pp * dp > cluster.size:
        raise SpecError(f"tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} ranks do not fit {where}")
    return dp


def _check_tp(model: ModelSpec, tp: int) -> None:
    if model.heads % tp:
        raise SpecError(f"tp={tp} does not divide heads={model.heads}")
    if model.query_groups % tp and (tp < model.query_groups or model.qkv_rows % tp):
        raise SpecError(
            f"tp={tp} does not divide query_groups={model.query_groups} "
            f"(tp > query_groups needs tp to divide the {model.qkv_rows} QKV rows)"
        )
    if model.ffn_hidden % tp:
        raise SpecError(f"tp={tp} does not divide ffn_hidden={model.ffn_hidden}")


def _check_layers(num_layers: int, parallel: ParallelConfig) -> None:
    pp, vpp = parallel.pp, parallel.vpp
    if not parallel.uneven and num_layers % (pp * vpp):
        what = f"pp*vpp={pp}*{vpp}" if vpp > 1 else f"pp={pp}"
        raise SpecError(f"num_layers={num_layers} is not divisible by {what}")
    if parallel.stage_layers is not None and sum(parallel.stage_layers) != num_layers:
        raise SpecError(
            f"stage_layers={list(parallel.stage_layers)} sum to {sum(parallel.stage_layers)}, not num_layers={num_layers}"
        )
    if parallel.first is not None or parallel.last is not None:
        ends = (parallel.first or 0) + (parallel.last or 0)
        middle = pp - (parallel.first is not None) - (parallel.last is not None)
        rest = num_layers - ends
        if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
            raise SpecError(
                f"num_layers={num_layers} minus first={parallel.first}, last={parallel.last} leaves {rest} "
                f"layers, which do not split evenly over the other {middle} stages"
            )


def _check_ep(model: ModelSpec, ep: int, dp: int) -> None:
    if ep == 1:
        return
    if not model.num_experts:
        raise SpecError(f"ep={ep} needs a mixture-of-experts model, but num_experts=0")
    if dp % ep:
        raise SpecError(f"ep={ep} does not divide dp={dp}")
    if model.num_experts % ep:
        raise SpecError(f"ep={ep} does not divide num_experts={model.num_experts}")
