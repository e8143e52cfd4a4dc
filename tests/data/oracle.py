"""An independent model of docs/dataset.md §10.1, written as plainly as possible.

No I/O, no numpy and no tenplex code: Philox4x64-10 is written out from its definition, the
permutation is "sort ids by draw, ties by id", batches are slices, and the split is the
documented balanced contiguous one. Tests compare the real system's delivered ids with `run`.
"""

from __future__ import annotations

import functools
import hashlib

M0, M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157  # Philox4x64 multipliers
W0, W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B  # Weyl key increments
MASK = (1 << 64) - 1


def philox_block(counter: int, key: int) -> list[int]:
    """Philox4x64-10 of a 256-bit counter under a 128-bit key (both as little-endian words)."""
    x = [(counter >> (64 * i)) & MASK for i in range(4)]
    k0, k1 = key & MASK, key >> 64
    for _ in range(10):
        p0, p1 = M0 * x[0], M1 * x[2]
        x = [((p1 >> 64) ^ x[1] ^ k0) & MASK, p1 & MASK, ((p0 >> 64) ^ x[3] ^ k1) & MASK, p0 & MASK]
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return x


def philox_raw(key: int, n: int) -> list[int]:
    """The first n 64-bit outputs: blocks for counters 1, 2, 3, ... (the counter starts at 0
    and is incremented before each block)."""
    out: list[int] = []
    counter = 0
    while len(out) < n:
        counter += 1
        out += philox_block(counter, key)
    return out[:n]


@functools.lru_cache(maxsize=64)
def permutation(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    digest = hashlib.sha256(f"tenplex.data.order/1:{seed}:{epoch}".encode()).digest()
    draws = philox_raw(int.from_bytes(digest[:16], "little"), n)
    return tuple(sorted(range(n), key=lambda i: (draws[i], i)))


def epoch_batches(n: int, g: int, seed: int, tail: str, epoch: int) -> list[list[int]]:
    perm = list(permutation(seed, epoch, n))
    read = n - n % g if tail == "drop" else n
    return [perm[i : i + g] for i in range(0, read, g)]


def dropped(n: int, g: int, seed: int, tail: str, epoch: int) -> list[int]:
    return list(permutation(seed, epoch, n))[n - n % g :] if tail == "drop" and n % g else []


def split(batch: list[int], world: int) -> list[list[int]]:
    q, m = divmod(len(batch), world)
    parts, start = [], 0
    for r in range(world):
        size = q + (1 if r < m else 0)
        parts.append(batch[start : start + size])
        start += size
    return parts


def world_at(schedule: list[tuple[int, int]], step: int) -> int:
    world = None
    for s, w in schedule:
        if s <= step:
            world = w
    return world


def run(
    n: int, g: int, seed: int, tail: str, schedule: list[tuple[int, int]], stop: int, start: int = 0
) -> list[tuple]:
    """[(epoch, step, rank, [ids])] for global steps [start, stop), step-major then rank."""
    per_epoch = len(epoch_batches(n, g, seed, tail, 0))
    log = []
    for step in range(start, stop):
        epoch, k = divmod(step, per_epoch)
        batch = epoch_batches(n, g, seed, tail, epoch)[k]
        for rank, part in enumerate(split(batch, world_at(schedule, step))):
            log.append((epoch, step, rank, part))
    return log
