"""What the parallelizer chose, and why, in words: a `Choice` (the winner among the fitting
candidates, with its source, "model" or "table") and its `explain()`.

Invariants: a `Choice`'s layout uses exactly its devices (tp·pp·dp = devices), fits its memory
budget, and its source is one of `SOURCES`.
"""

from __future__ import annotations

import attrs

from tenplex.elastic.parallelizer.cost import Candidate, local_params, parallel_config
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tenplex.ir.errors import SpecError

__all__ = ["GB", "SOURCES", "Choice", "describe", "gb", "pct"]

GB = 1e9
SOURCES = ("model", "table")


def gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB"


def pct(part: float, whole: float) -> str:
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
            raise SpecError(f"choice {self.best.name} needs {gb(self.best.memory.total)} > {gb(self.memory_per_gpu)}")

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
            f"predicted, {gb(b.memory.total)} of {gb(self.memory_per_gpu)} per GPU."
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
        text = f"- tp={b.tp} inside a host (NVLink): its all-reduces take {b.tp_comm_s:.3g} s per step ({pct(b.tp_comm_s, b.step_seconds)})"
        if not any(c.fits and c.tp < b.tp for c in self.candidates):
            low = self._smallest_need(lambda c: c.tp < b.tp)
            if low is None:
                return text + "; no layout with a smaller tp is valid."
            return (
                text
                + f"; no layout with a smaller tp fits {gb(self.memory_per_gpu)} (the least is {gb(low.memory.total)}, {low.name})."
            )
        return text + "; faster than the layouts with a smaller tp that fit."

    def _why_pp(self) -> str:
        b = self.best
        if b.pp == 1:
            return "- pp=1: no pipeline bubble."
        split = "/".join(map(str, b.stage_layers))
        text = f"- pp={b.pp} (layers {split}): bubble {pct(b.bubble, 1)} with {b.micro_batches} micro-batches per pipeline"
        if not any(c.fits and c.pp < b.pp for c in self.candidates):
            low = self._smallest_need(lambda c: c.pp < b.pp)
            if low is None:
                return text + "; no layout with fewer stages is valid."
            mem = b.memory
            return text + (
                f"; weights+grads+Adam ({gb(mem.weights + mem.grads + mem.optimizer)}) and activations "
                f"({gb(mem.activations)}) need {b.pp} stages to fit {gb(self.memory_per_gpu)}; with fewer "
                f"stages the least is {gb(low.memory.total)} ({low.name})."
            )
        return text + "; faster than the layouts with fewer stages that fit."

    def _why_dp(self) -> str:
        b = self.best
        if b.dp == 1:
            return "- dp=1: a single model replica, no gradient all-reduce."
        link = "the network" if b.dp_network else "NVLink"
        return f"- dp={b.dp}: the gradient all-reduce over {link} takes {b.dp_comm_s:.3g} s per step ({pct(b.dp_comm_s, b.step_seconds)})."

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
        slower = pct(r.step_seconds - b.step_seconds, b.step_seconds)
        return (
            f"Next best {r.name} is {slower} slower ({r.step_seconds:.3g} s per step) because of its {what}: "
            f"{theirs:.3g} s instead of {mine:.3g} s."
        )
