"""Megatron RNG state re-derived from the seed rules, never copied between ranks (docs/conventions.md §5.1).

`rng_state` is a list with one entry (or DP entries with `data_parallel_random_init`) of
`{'random_rng_state', 'np_rng_state', 'torch_rng_state', 'cuda_rng_state', 'rng_tracker_states'}`.
Megatron seeds rank (pp, tp, dp) with `s = seed + 100·pp (+ 10·dp with data_parallel_random_init)`:
Python, numpy, torch CPU, the default CUDA generator and the `data-parallel-rng` tracker get `s`;
`model-parallel-rng` gets `s + 2718 + tp`; `expert-parallel-rng` gets `s + 1024 + 100·ep + tp`.
The frontend's per-rank `rng` value carries the offsets (`seed_offset` = 100·pp,
`model_parallel_seed_offset` = 2718 + tp).

A CUDA generator state is 16 bytes: the seed as uint64 and the Philox offset as int64,
little-endian (torch's `CUDAGeneratorImpl::get_state`); torch <= 2.0 prefixed 800 bytes of
0xFF (the retired MTGP states). The width the source used is kept; states are built here without a GPU.

Invariants: the states are those right after seeding (a fresh stream per rank); only the keys and
tracker names the source checkpoint had are written.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

KEYS = ("random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states")
TRACKERS = ("data-parallel-rng", "model-parallel-rng", "expert-parallel-rng")


def cuda_state(seed: int, width: int = 16) -> torch.Tensor:
    """torch.cuda.get_rng_state() right after torch.cuda.manual_seed(seed), `width` bytes long."""
    return torch.tensor([255] * (width - 16) + list(struct.pack("<Qq", seed % 2**64, 0)), dtype=torch.uint8)


def rng_entry(seed: int, model_parallel_seed: int, expert_seed: int, keys: Sequence[str], trackers: Sequence[str],
              width: int = 16) -> dict:  # fmt: skip
    """One `rng_state` entry for a rank seeded with `seed`."""
    values: dict[str, Any] = {
        "random_rng_state": random.Random(seed).getstate(),
        "np_rng_state": np.random.RandomState(seed % 2**32).get_state(),
        "torch_rng_state": torch.Generator().manual_seed(seed).get_state(),
        "cuda_rng_state": cuda_state(seed, width),
    }
    tracker_seeds = {"data-parallel-rng": seed, "model-parallel-rng": model_parallel_seed,
                     "expert-parallel-rng": expert_seed}  # fmt: skip
    values["rng_tracker_states"] = {name: cuda_state(tracker_seeds[name], width) for name in trackers}
    return {k: values[k] for k in keys}


def rng_state(seed: int, offsets: Mapping[str, int], dp: int, per_dp: bool, keys: Sequence[str],
              trackers: Sequence[str], width: int = 16) -> list[dict]:  # fmt: skip
    """The `rng_state` list of one (pp, tp) rank file from the job seed and the rank's offsets."""
    tp = offsets["model_parallel_seed_offset"] - 2718
    out = []
    for d in range(dp if per_dp else 1):
        s = seed + offsets["seed_offset"] + (10 * d if per_dp else 0)
        expert = s + offsets.get("expert_parallel_seed_offset", 1024 + tp)
        out.append(rng_entry(s, s + offsets["model_parallel_seed_offset"], expert, keys, trackers, width))
    return out


def rng_layout(value: Any) -> tuple[tuple[str, ...], tuple[str, ...], int] | None:
    """(entry keys, tracker names, CUDA state width) of a file's `rng_state`, or None without one."""
    if not isinstance(value, list) or not value or not isinstance(value[0], Mapping):
        return None
    entry = value[0]
    trackers = entry.get("rng_tracker_states")
    names = tuple(n for n in trackers if n in TRACKERS) if isinstance(trackers, Mapping) else ()
    cuda = entry.get("cuda_rng_state")
    width = cuda.numel() if isinstance(cuda, torch.Tensor) and cuda.numel() >= 16 else 16
    return tuple(k for k in entry if k in KEYS), names, width
