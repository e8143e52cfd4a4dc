"""Pipeline (`PipelineModule`) DeepSpeed checkpoints: which stage holds which layer.

A PipelineEngine saves each layer's `state_dict` as `layer_{idx:02d}-model_states.pt` (global
layer index, keys local to the layer: the parameter `{idx}.weight` is key `weight` of layer
file idx), and per stage s `mp_rank_{s:02d}_model_states.pt` (`module` None, `param_shapes` the
stage's parameters) and `zero_pp_rank_{d}_mp_rank_{s:02d}_optim_states.pt`. Stage s holds layers
[parts[s], parts[s+1]); DeepSpeed computes `parts` from the model code (`partition_method`:
'parameters', its default, balances trainable parameter counts; 'uniform' balances layer
counts), which the checkpoint does not record. tenplex finds which of the two methods reproduce
the source's stages (`methods`) and uses it for the new stage count; when both fit the source
but split the new count differently, or neither fits, it refuses (`parts_for`), never guesses.

Limits: layers without a `state_dict` (plain functions in the layer list) have no file, so a
model whose last layers are functions has more layers than tenplex sees (the 'uniform' method
then does not fit, and 'parameters' is unaffected); tied layers and TP within the pipeline
(`layer_XX-model_YY` files) are refused by `files.locate`.
"""

from __future__ import annotations

from collections.abc import Sequence

UNIFORM, PARAMETERS = "uniform", "parameters"


def layer_of(name: str) -> int:
    """The global layer index of parameter `name` (`{idx}.<key>`)."""
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() else -1


def partition_uniform(n: int, parts: int) -> list[int]:
    """DeepSpeed's `partition_uniform` (runtime/utils.py): stage boundaries of n layers."""
    if n <= parts:
        return [min(p, n) for p in range(parts + 1)]
    size, rest = divmod(n, parts)
    return [p * size + min(p, rest) for p in range(parts + 1)]


def partition_balanced(weights: Sequence[int], parts: int) -> list[int]:
    """DeepSpeed's `partition_balanced` (the same dynamic program, the same tie-breaking)."""
    n, m = len(weights), parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    best = [[(inf, inf, inf)] * (m + 1) for _ in range(n + 1)]  # (cost, max, min)
    best[0][0] = (0, 0, inf)
    pos = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                hi = max(best[k][j - 1][1], prefix[i] - prefix[k])
                lo = min(best[k][j - 1][2], prefix[i] - prefix[k])
                if best[i][j][0] >= hi - lo:
                    best[i][j], pos[i][j] = (hi - lo, hi, lo), k
    out = [n]
    for j in range(m, 0, -1):
        out.append(pos[out[-1]][j])
    return out[::-1]


def partition(method: str, weights: Sequence[int], parts: int) -> list[int]:
    return partition_uniform(len(weights), parts) if method == UNIFORM else partition_balanced(weights, parts)


def methods(weights: Sequence[int], stage_layers: Sequence[set[int]]) -> tuple[str, ...]:
    """The partition methods whose stages for len(stage_layers) stages hold each stage's layers
    (the layers with parameters each stage file names)."""
    fits = []
    for method in (PARAMETERS, UNIFORM):
        parts = partition(method, weights, len(stage_layers))
        if all(all(parts[s] <= i < parts[s + 1] for i in layers) for s, layers in enumerate(stage_layers)):
            fits.append(method)
    return tuple(fits)
