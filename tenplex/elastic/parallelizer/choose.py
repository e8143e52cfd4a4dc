"""The parallelizer: which (tp, pp, dp) a job should run with on a given number of devices.

`choose(devices, model, gpus_per_host)` enumerates every (tp, pp, dp) with tp·pp·dp = devices,
drops the invalid ones (`parallelizer.cost.check_valid`: the frontend's `fit`, TP groups inside
a host, the global batch divisible by dp·micro_batch), predicts each one's step time and peak
memory per GPU (`parallelizer.cost`, which documents the formulas and constants), and returns the
fastest that fits `memory_per_gpu`. With a user `table` (device count -> (tp, pp, dp), as the
Tenplex reference's para-config), an entry for `devices` overrides the cost model and is
checked the same way; a device count the table lacks falls back to the cost model.

Tie-breaking (deterministic): lower predicted step time, then less memory per GPU, then fewer
pipeline stages, then smaller tp (`Candidate.key`).

Invariants:
- a `Choice`'s layout uses exactly its devices (tp·pp·dp = devices) and fits its memory budget;
- source is "model" or "table"; with "model" the choice is the first of the fitting candidates
  in `Candidate.key` order, so no enumerated valid fitting layout is predicted faster;
- every table entry maps a device count n >= 1 to three positive integers whose product is n.

Raises (all `SpecError`s, hence `TenplexError`s): `NoFitError` when no valid layout fits (naming
the devices, the model and the smallest memory need), `TableEntryError` naming a bad entry.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from tenplex.elastic.parallelizer.cost import (
    Candidate,
    Hardware,
    Workload,
    check_valid,
    evaluate,
    layouts,
    local_params,
    parallel_config,
)
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tenplex.ir.errors import SpecError

GB = 1e9
SOURCES = ("model", "table")


class NoFitError(SpecError):
    """No valid (tp, pp, dp) of the model fits the devices' memory."""


class TableEntryError(SpecError):
    """A user table entry is malformed, invalid for the model, or does not fit memory."""


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def describe(model: ModelSpec) -> str:
    """A one-line summary of a model for messages: kind, parameters, layers, hidden, heads."""
    layer, first, last, _ = local_params(model, 1, 1)
    total = model.num_layers * layer + first + last
    size = f"{total / 1e9:.3g}B" if total >= 1e9 else f"{total / 1e6:.3g}M"
    return (
        f"{model.kind} model ({size} parameters, {model.num_layers} layers, hidden {model.hidden}, {model.heads} heads)"
    )


@attrs.frozen
class Choice:
    """The chosen layout, its prediction, and every valid alternative (fitting ones first, by
    preference; then the others by memory)."""

    devices: int
    gpus_per_host: int
    memory_per_gpu: float
    source: str
    best: Candidate
    candidates: tuple[Candidate, ...] = attrs.field(converter=tuple)
    model: str = ""  # `describe(model)`, for explanations

    def __attrs_post_init__(self) -> None:
        if self.source not in SOURCES:
            raise SpecError(f"choice source={self.source!r} is not one of {list(SOURCES)}")
        if self.best.tp * self.best.pp * self.best.dp != self.devices:
            raise SpecError(f"choice {self.best.name} does not use exactly {self.devices} devices")
        if not self.best.fits:
            raise SpecError(f"choice {self.best.name} needs {_gb(self.best.memory.total)} > {_gb(self.memory_per_gpu)}")

    tp = property(lambda self: self.best.tp)
    pp = property(lambda self: self.best.pp)
    dp = property(lambda self: self.best.dp)
    step_seconds = property(lambda self: self.best.step_seconds)
    memory_bytes = property(lambda self: self.best.memory.total)

    @property
    def runners_up(self) -> tuple[Candidate, ...]:
        """The next (at most three) fitting layouts in preference order."""
        return tuple(c for c in self.candidates if c.fits and c != self.best)[:3]

    @property
    def model_best(self) -> Candidate:
        """The cost model's pick (differs from `best` only with a table entry)."""
        return next(c for c in self.candidates if c.fits)

    def parallel(self, model: ModelSpec, zero1: bool = False) -> ParallelConfig:
        """The frontend config of the choice (an uneven split as stage_layers)."""
        return parallel_config(model, self.tp, self.pp, self.dp, zero1)

    def explain(self) -> str:
        """Why this layout, in plain words: one line per degree, then the next best."""
        b = self.best
        hosts = -(-self.devices // self.gpus_per_host)
        where = f"{self.devices} devices ({hosts} host{'s' * (hosts > 1)} of {self.gpus_per_host} GPUs)"
        how = "from the user table" if self.source == "table" else "chosen by the cost model"
        lines = [
            f"{b.name} for {self.model or 'the model'} on {where}, {how}: {b.step_seconds:.3g} s per step "
            f"predicted, {_gb(b.memory.total)} of {_gb(self.memory_per_gpu)} per GPU."
        ]
        lines += [self._why_tp(), self._why_pp(), self._why_dp(), self._next_best()]
        if self.source == "table" and self.model_best != b:
            m = self.model_best
            lines.append(f"The cost model would pick {m.name} at {m.step_seconds:.3g} s per step.")
        return "\n".join(lines)

    def _smallest_need(self, keep) -> Candidate | None:
        rest = [c for c in self.candidates if keep(c)]
        return min(rest, key=lambda c: c.memory.total) if rest else None

    def _why_tp(self) -> str:
        b = self.best
        if b.tp == 1:
            return "- tp=1: no tensor-parallel all-reduces."
        text = f"- tp={b.tp} inside a host (NVLink): its all-reduces take {b.tp_comm_s:.3g} s per step ({_pct(b.tp_comm_s, b.step_seconds)})"
        if not any(c.fits and c.tp < b.tp for c in self.candidates):
            low = self._smallest_need(lambda c: c.tp < b.tp)
            if low is None:
                return text + "; no layout with a smaller tp is valid."
            return (
                text
                + f"; no layout with a smaller tp fits {_gb(self.memory_per_gpu)} (the least is {_gb(low.memory.total)}, {low.name})."
            )
        return text + "; faster than the layouts with a smaller tp that fit."

    def _why_pp(self) -> str:
        b = self.best
        if b.pp == 1:
            return "- pp=1: no pipeline bubble."
        split = "/".join(map(str, b.stage_layers))
        text = f"- pp={b.pp} (layers {split}): bubble {_pct(b.bubble, 1)} with {b.micro_batches} micro-batches per pipeline"
        if not any(c.fits and c.pp < b.pp for c in self.candidates):
            low = self._smallest_need(lambda c: c.pp < b.pp)
            if low is None:
                return text + "; no layout with fewer stages is valid."
            mem = b.memory
            return text + (
                f"; weights+grads+Adam ({_gb(mem.weights + mem.grads + mem.optimizer)}) and activations "
                f"({_gb(mem.activations)}) need {b.pp} stages to fit {_gb(self.memory_per_gpu)}; with fewer "
                f"stages the least is {_gb(low.memory.total)} ({low.name})."
            )
        return text + "; faster than the layouts with fewer stages that fit."

    def _why_dp(self) -> str:
        b = self.best
        if b.dp == 1:
            return "- dp=1: a single model replica, no gradient all-reduce."
        link = "the network" if b.dp_network else "NVLink"
        return f"- dp={b.dp}: the gradient all-reduce over {link} takes {b.dp_comm_s:.3g} s per step ({_pct(b.dp_comm_s, b.step_seconds)})."

    def _next_best(self) -> str:
        if not self.runners_up:
            return "No other valid layout fits."
        b, r = self.best, self.runners_up[0]
        causes = [
            ("compute on its slowest stage", b.compute_s, r.compute_s),
            ("pipeline bubble", b.bubble_s, r.bubble_s),
            ("tensor-parallel all-reduces", b.tp_comm_s, r.tp_comm_s),
            ("pipeline transfers", b.pp_comm_s, r.pp_comm_s),
            ("gradient all-reduce", b.dp_comm_s, r.dp_comm_s),
        ]
        what, mine, theirs = max(causes, key=lambda c: c[2] - c[1])
        if r.step_seconds == b.step_seconds:
            return f"Next best {r.name} is as fast; the tie goes to less memory, then fewer stages, then smaller tp."
        slower = _pct(r.step_seconds - b.step_seconds, b.step_seconds)
        return (
            f"Next best {r.name} is {slower} slower ({r.step_seconds:.3g} s per step) because of its {what}: "
            f"{theirs:.3g} s instead of {mine:.3g} s."
        )


def _check_args(devices: int, model: ModelSpec, gpus_per_host: int, memory_per_gpu: float, w: Workload) -> None:
    for field, value in (
        ("devices", devices),
        ("gpus_per_host", gpus_per_host),
        ("global_batch", w.global_batch),
        ("micro_batch", w.micro_batch),
        ("seq", w.seq),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{field}={value!r} must be an integer >= 1")
    if not memory_per_gpu > 0:
        raise SpecError(f"memory_per_gpu={memory_per_gpu!r} must be > 0 bytes")
    if model.max_position and w.seq > model.max_position:
        raise SpecError(f"seq={w.seq} exceeds the model's max_position={model.max_position}")


def _check_table(table: Mapping[int, tuple[int, int, int]]) -> None:
    for n, entry in table.items():
        ok = isinstance(n, int) and not isinstance(n, bool) and n >= 1
        if not ok or not isinstance(entry, tuple | list) or len(entry) != 3:
            raise TableEntryError(f"table entry {n!r}: {entry!r} must map a device count >= 1 to (tp, pp, dp)")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in entry):
            raise TableEntryError(f"table entry {n}: {tuple(entry)!r} must be three integers >= 1")
        if entry[0] * entry[1] * entry[2] != n:
            product = entry[0] * entry[1] * entry[2]
            raise TableEntryError(f"table entry {n}: tp*pp*dp = {'*'.join(map(str, entry))} = {product}, not {n}")


def _no_fit(devices: int, desc: str, memory_per_gpu: float, cands: list[Candidate], reasons: list[str]) -> NoFitError:
    if not cands:
        shown = "; ".join(reasons[:4]) + ("; ..." if len(reasons) > 4 else "")
        return NoFitError(f"no valid (tp, pp, dp) of the {desc} for {devices} devices: {shown}")
    low = min(cands, key=lambda c: c.memory.total)
    m = low.memory
    return NoFitError(
        f"no (tp, pp, dp) of the {desc} fits {devices} devices with {_gb(memory_per_gpu)} per GPU: the smallest "
        f"need is {_gb(m.total)} per GPU ({low.name}: weights {_gb(m.weights)}, grads {_gb(m.grads)}, Adam "
        f"{_gb(m.optimizer)}, activations {_gb(m.activations)}, reserved {_gb(m.reserved)}); try more devices, "
        "zero1=True or recompute=True"
    )


def choose(
    devices: int,
    model: ModelSpec,
    gpus_per_host: int,
    *,
    table: Mapping[int, tuple[int, int, int]] | None = None,
    memory_per_gpu: float = 80e9,
    global_batch: int = 512,
    micro_batch: int = 1,
    seq: int | None = None,
    zero1: bool = False,
    recompute: bool = False,
    hardware: Hardware = Hardware(),  # noqa: B008 (frozen, so a shared default is safe)
) -> Choice:
    """The fastest valid (tp, pp, dp) on `devices` GPUs that fits `memory_per_gpu`, or the table's entry.

    `seq` defaults to the model's max_position (2048 for RoPE models).

    Raises:
        SpecError: a bad argument, naming it.
        TableEntryError: the table's entry (or any entry's shape) is malformed, invalid or does not fit.
        NoFitError: no valid layout fits; names the devices, the model and the smallest need.
    """
    w = Workload(global_batch, micro_batch, seq if seq is not None else (model.max_position or 2048), zero1, recompute)
    _check_args(devices, model, gpus_per_host, memory_per_gpu, w)
    desc = describe(model)
    cands, reasons = [], []
    for tp, pp, dp in layouts(devices):
        reason = check_valid(model, tp, pp, dp, gpus_per_host, w)
        if reason is None:
            cands.append(evaluate(model, tp, pp, dp, gpus_per_host, w, hardware, memory_per_gpu))
        else:
            reasons.append(f"tp={tp},pp={pp},dp={dp}: {reason}")
    cands.sort(key=lambda c: (not c.fits, c.key if c.fits else (c.memory.total, c.pp, c.tp)))
    entry = None
    if table is not None:
        _check_table(table)
        entry = table.get(devices)
    if entry is not None:
        best = _from_table(devices, tuple(entry), model, desc, gpus_per_host, w, hardware, memory_per_gpu)
    elif cands and cands[0].fits:
        best = cands[0]
    else:
        raise _no_fit(devices, desc, memory_per_gpu, cands, reasons)
    source = "model" if entry is None else "table"
    return Choice(devices, gpus_per_host, memory_per_gpu, source, best, cands, desc)


def _from_table(
    devices: int,
    entry: tuple[int, int, int],
    model: ModelSpec,
    desc: str,
    gpus_per_host: int,
    w: Workload,
    hw: Hardware,
    memory_per_gpu: float,
) -> Candidate:
    tp, pp, dp = entry
    name = f"table entry {devices}: (tp={tp}, pp={pp}, dp={dp})"
    reason = check_valid(model, tp, pp, dp, gpus_per_host, w)
    if reason is not None:
        raise TableEntryError(f"{name} is invalid for the {desc}: {reason}")
    cand = evaluate(model, tp, pp, dp, gpus_per_host, w, hw, memory_per_gpu)
    if not cand.fits:
        m = cand.memory
        raise TableEntryError(
            f"{name} needs {_gb(m.total)} per GPU (weights {_gb(m.weights)}, grads {_gb(m.grads)}, Adam "
            f"{_gb(m.optimizer)}, activations {_gb(m.activations)}) but memory_per_gpu is {_gb(memory_per_gpu)}"
        )
    return cand
