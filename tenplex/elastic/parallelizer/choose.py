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

from tenplex.elastic.parallelizer.choice import Choice, describe, gb
from tenplex.elastic.parallelizer.cost import (
    Candidate,
    Hardware,
    Workload,
    check_valid,
    evaluate,
    layouts,
)
from tenplex.frontends.model import ModelSpec
from tenplex.ir.errors import SpecError


class NoFitError(SpecError):
    """No valid (tp, pp, dp) of the model fits the devices' memory."""


class TableEntryError(SpecError):
    """A user table entry is malformed, invalid for the model, or does not fit memory."""


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
        f"no (tp, pp, dp) of the {desc} fits {devices} devices with {gb(memory_per_gpu)} per GPU: the smallest "
        f"need is {gb(m.total)} per GPU ({low.name}: weights {gb(m.weights)}, grads {gb(m.grads)}, Adam "
        f"{gb(m.optimizer)}, activations {gb(m.activations)}, reserved {gb(m.reserved)}); try more devices, "
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
            f"{name} needs {gb(m.total)} per GPU (weights {gb(m.weights)}, grads {gb(m.grads)}, Adam "
            f"{gb(m.optimizer)}, activations {gb(m.activations)}) but memory_per_gpu is {gb(memory_per_gpu)}"
        )
    return cand
