"""Pipeline placement: which global layers each (PP rank, virtual chunk) holds.

Megatron numbers layers locally: a chunk's keys say `layers.{i}` with i restarting at 0, and
the global layer is `offset + i`.

- Even split: `offset(pp) = pp·L/p`.
- Virtual pipeline (v chunks per PP rank): `offset(pp, vp) = vp·L/v + pp·L/(p·v)`; the global
  order is vp-major (L=8, p=2, v=2: PP0 model0 = 0,1; PP1 model0 = 2,3; PP0 model1 = 4,5; ...).
- Uneven split: first/last stage counts with the other stages sharing the rest evenly, or
  explicit per-stage counts; offsets are the running sums.

Embeddings live in chunk 0 of PP rank 0; the final norm and the head in chunk v-1 of PP rank p-1.

Invariants: the chunks' layer ranges tile [0, L) exactly (checked by `fit` beforehand).
"""

from __future__ import annotations

import itertools

import attrs

from tenplex.frontends.parallel import ParallelConfig


@attrs.frozen
class Chunk:
    """Global layers [start, stop) of virtual chunk `vp` on PP rank `pp`."""

    pp: int
    vp: int
    start: int
    stop: int
    first: bool  # holds the embeddings
    last: bool  # holds the final norm and the output layer (or the tied copy)
    prefix: str  # the state-dict key of the chunk: `model`, or `model{vp}` with virtual pipeline

    @property
    def layers(self) -> range:
        return range(self.start, self.stop)


def stage_layer_counts(num_layers: int, parallel: ParallelConfig) -> tuple[int, ...]:
    """Layers per PP stage (all virtual chunks together)."""
    p = parallel.pp
    if parallel.stage_layers is not None:
        return parallel.stage_layers
    if parallel.first is None and parallel.last is None:
        return (num_layers // p,) * p
    ends = [n for n in (parallel.first, parallel.last) if n is not None]
    middle = p - len(ends)
    share = (num_layers - sum(ends)) // middle if middle else 0
    counts = [share] * p
    if parallel.first is not None:
        counts[0] = parallel.first
    if parallel.last is not None:
        counts[-1] = parallel.last
    return tuple(counts)


def chunks(num_layers: int, parallel: ParallelConfig) -> tuple[Chunk, ...]:
    """Every chunk, ordered by (pp, vp)."""
    p, v = parallel.pp, parallel.vpp
    if v == 1:
        counts = stage_layer_counts(num_layers, parallel)
        offsets = (0, *itertools.accumulate(counts))
        spans = {(pp, 0): (offsets[pp], offsets[pp + 1]) for pp in range(p)}
    else:
        n = num_layers // (p * v)
        spans = {
            (pp, vp): (vp * num_layers // v + pp * n, vp * num_layers // v + (pp + 1) * n)
            for pp in range(p)
            for vp in range(v)
        }
    return tuple(
        Chunk(
            pp,
            vp,
            *spans[pp, vp],
            first=(pp, vp) == (0, 0),
            last=(pp, vp) == (p - 1, v - 1),
            prefix=f"model{vp}" if v > 1 else "model",
        )
        for pp in range(p)
        for vp in range(v)
    )
