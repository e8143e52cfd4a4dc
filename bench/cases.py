"""The benchmark cases: named (src spec, dst spec) pairs, full and quick.

Specs use `tenplex.frontends.spec`'s compact syntax. Device ids are shared by src and dst: a
cluster `@HxG` holds devices 0 .. H*G-1, so a smaller cluster is a subset of a larger one (an
8 → 16 GPU scale-up keeps the first two hosts; a scale-down keeps the first hosts).
"""

from __future__ import annotations

import attrs

GPUS_PER_HOST = 4  # the paper's cluster: 4 hosts x 4 GPUs
PAPER_MODELS = ("gpt-1.3b", "gpt-2.7b", "gpt-6.7b")  # GPT-3 XL, 2.7B, 6.7B


@attrs.frozen
class Case:
    name: str
    src: str
    dst: str
    goal_s: tuple[float | None, float | None] | None = None  # compile and check CPU seconds to stay within
    gpus: int | None = None  # set on the cases of the scaling series (the same change at growing size)


def _spec(model: str, tpd: tuple[int, int, int], extra: str = "") -> str:
    tp, pp, dp = tpd
    gpus = tp * pp * dp
    hosts = max(1, gpus // GPUS_PER_HOST)
    return f"{model}:tp{tp},pp{pp},dp{dp}{extra}@{hosts}x{min(gpus, GPUS_PER_HOST)}"


def _label(a: tuple[int, int, int], b: tuple[int, int, int]) -> str:
    return f"({','.join(map(str, a))})→({','.join(map(str, b))})"


# (T, P, D) reconfigurations of the paper's Fig. 14 (8 → 16 GPUs) and Fig. 9 (16 → 8 → 4 GPUs).
PAPER_CHANGES: tuple[tuple[tuple[int, int, int], tuple[int, int, int]], ...] = (
    ((4, 2, 1), (4, 2, 2)),
    ((4, 2, 1), (4, 4, 1)),
    ((4, 2, 1), (8, 2, 1)),
    ((2, 4, 2), (2, 4, 1)),
    ((2, 4, 1), (2, 2, 1)),
)


def paper_cases(models: tuple[str, ...] = PAPER_MODELS, extra: str = "") -> list[Case]:
    """One case per model and (T, P, D) change; `extra` adds spec options (e.g. model overrides)."""
    return [
        Case(f"{m}{extra} {_label(a, b)}", _spec(m, a, extra), _spec(m, b, extra))
        for m in models
        for a, b in PAPER_CHANGES
    ]


def _scaled(n: int, goal_s: tuple[float | None, float | None] | None = None) -> Case:
    """GPT-3 175B, pp16 -> pp12 at TP8 and DP 8n: 1024n -> 768n GPUs, 8 per host."""
    src, dst = f"gpt-175b:tp8,pp16,dp{8 * n}@{128 * n}x8", f"gpt-175b:tp8,pp12,dp{8 * n}@{96 * n}x8"
    return Case(f"gpt-175b pp16→pp12, {1024 * n}→{768 * n} GPUs", src, dst, goal_s, 1024 * n)


# Goals of issue 16: compile <= 1 s and check <= 1 s at 1024 GPUs; compile <= 5 s at 4096, growing linearly.
COMPILE_CASES = [
    _scaled(1, (1.0, 1.0)),
    _scaled(2),
    _scaled(4, (5.0, None)),
    Case("gpt-6.7b tp8→tp4, 32 GPUs", "gpt-6.7b:tp8,pp2,dp2@4x8", "gpt-6.7b:tp4,pp2,dp4@4x8"),
]
QUICK_COMPILE_CASES = [
    Case("gpt-1.3b pp4→pp2, 32→16 GPUs", "gpt-1.3b:tp4,pp4,dp2@8x4", "gpt-1.3b:tp4,pp2,dp2@4x4", gpus=32),
    Case("gpt-1.3b pp4→pp2, 64→32 GPUs", "gpt-1.3b:tp4,pp4,dp4@16x4", "gpt-1.3b:tp4,pp2,dp4@8x4", gpus=64),
]


def bytes_cases(quick: bool) -> list[Case]:
    """Quick: GPT-3 XL cut to 8 layers (same widths, so the same TP/DP splits)."""
    return paper_cases(("gpt-1.3b",), ",layers=8") if quick else paper_cases()


def compile_cases(quick: bool) -> list[Case]:
    return QUICK_COMPILE_CASES if quick else COMPILE_CASES
