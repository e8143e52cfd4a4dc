"""The global sample order: which samples make global batch s, for any step s of any epoch.

Order stream v1 (`ORDER_VERSION`), pinned so that it never changes:
- key = the first 16 bytes of sha256(f"tenplex.data.order/1:{seed}:{epoch}".encode()), read as a
  little-endian 128-bit integer (low 64 bits = Philox key word 0);
- draws = the first N outputs of Philox4x64-10 with that key and counter 0 (numpy
  `Philox(key=key).random_raw(N)`, whose raw stream numpy keeps stable);
- pi_e = the stable argsort of the draws: sample ids by draw, ties by id.
The permutation depends on (seed, epoch, N) only: never on the number of ranks.

Steps are counted globally from the start of training. With global batch G and
`steps_per_epoch` S, step s is step s mod S of epoch s // S, and its global batch is
`pi_e[k*G : (k+1)*G]` for k = s mod S. Tail policies (when G does not divide N):
- "drop": S = N // G; the last N mod G samples of pi_e are not read in epoch e (`dropped`);
- "partial": S = ceil(N / G); the last step of every epoch has a smaller batch of N mod G.
Either way the tail is the same for every number of ranks.

Invariants:
- N >= 1, G >= 1, seed in [0, 2^64), tail policy in TAIL_POLICIES;
- with "drop", G <= N (an epoch has at least one step).
"""

from __future__ import annotations

import functools
import hashlib
import math

import attrs
import numpy as np

from tenplex.data.errors import DataError

ORDER_VERSION = 1
TAIL_POLICIES = ("drop", "partial")


def _nonneg_int(name: str, value: object, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DataError(f"{name}: expected an integer >= {low}, got {value!r}")


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    digest = hashlib.sha256(f"tenplex.data.order/{ORDER_VERSION}:{seed}:{epoch}".encode()).digest()
    draws = np.random.Philox(key=int.from_bytes(digest[:16], "little")).random_raw(n)
    order = np.argsort(draws, kind="stable").astype(np.int64)
    order.setflags(write=False)
    return order


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """pi_epoch: a read-only permutation of 0..n-1 (order stream v1)."""
    _nonneg_int("seed", seed)
    _nonneg_int("epoch", epoch)
    _nonneg_int("samples", n)
    if seed >= 1 << 64:
        raise DataError(f"seed: expected an integer below 2**64, got {seed}")
    return _permutation(seed, epoch, n)


@attrs.frozen
class Order:
    """The global batches of a job: N samples, global batch G, a seed and a tail policy."""

    samples: int
    global_batch: int
    seed: int
    tail_policy: str = "drop"

    def __attrs_post_init__(self) -> None:
        _nonneg_int("samples", self.samples, 1)
        _nonneg_int("global_batch", self.global_batch, 1)
        _nonneg_int("seed", self.seed)
        if self.seed >= 1 << 64:
            raise DataError(f"seed: expected an integer below 2**64, got {self.seed}")
        if self.tail_policy not in TAIL_POLICIES:
            raise DataError(f"tail_policy: {self.tail_policy!r} is not one of {list(TAIL_POLICIES)}")
        if self.tail_policy == "drop" and self.global_batch > self.samples:
            raise DataError(f"global_batch: {self.global_batch} exceeds the {self.samples} samples of the index, "
                            "so tail policy 'drop' leaves no step in an epoch")  # fmt: skip

    @property
    def steps_per_epoch(self) -> int:
        if self.tail_policy == "drop":
            return self.samples // self.global_batch
        return math.ceil(self.samples / self.global_batch)

    @property
    def samples_per_epoch(self) -> int:
        """N_eff: samples read in one epoch (N minus the dropped tail)."""
        if self.tail_policy == "drop":
            return self.steps_per_epoch * self.global_batch
        return self.samples

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of global step `step`."""
        _nonneg_int("step", step)
        return divmod(step, self.steps_per_epoch)

    def epoch(self, epoch: int) -> np.ndarray:
        """pi_epoch, the whole permutation (including a dropped tail)."""
        return epoch_order(self.seed, epoch, self.samples)

    def batch(self, step: int) -> np.ndarray:
        """B_step: the ordered sample ids of global step `step` (G of them, fewer only for the
        last step of an epoch under "partial")."""
        epoch, k = self.locate(step)
        g = self.global_batch
        return self.epoch(epoch)[k * g : min((k + 1) * g, self.samples_per_epoch)]

    def batch_size(self, step: int) -> int:
        """len(B_step), without computing the permutation."""
        _, k = self.locate(step)
        return min(self.global_batch, self.samples_per_epoch - k * self.global_batch)

    def dropped(self, epoch: int) -> np.ndarray:
        """The samples of pi_epoch that epoch `epoch` does not read (empty unless "drop")."""
        return self.epoch(epoch)[self.samples_per_epoch :]

    def consumed_samples(self, step: int) -> int:
        """Samples read before global step `step`: epoch x N_eff + cursor."""
        epoch, k = self.locate(step)
        return epoch * self.samples_per_epoch + k * self.global_batch
