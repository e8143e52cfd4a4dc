"""The dataset state: one global cursor, O(1) in size, independent of the number of ranks.

    {"version": 1, "fingerprint": ..., "seed": S, "epoch": e, "cursor": c,
     "global_batch": G, "tail_policy": "drop" | "partial"}

`cursor` counts the samples of epoch `epoch` consumed by committed optimizer steps, so the next
step to run is `epoch x steps_per_epoch + cursor / G`. A state is immutable: the trainer replaces
it with `commit(order)` once an optimizer step is committed, never when a loader merely reads or
prefetches. A commit that completes an epoch gives (epoch + 1, cursor 0), so a state saved at an
epoch end resumes at the first step of the next epoch. Version 1 states use order stream v1
(`tenplex.data.order`).

Invariants:
- version == STATE_VERSION; tail_policy in TAIL_POLICIES;
- seed, epoch, cursor >= 0 and global_batch >= 1 are integers; cursor is a multiple of G;
- against an index (`order_for`): the fingerprints agree and cursor < N_eff.

Raises: `DataError` naming the source and the field; a mismatch quotes both values.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

from tenplex.data.errors import DataError
from tenplex.data.index import DatasetIndex
from tenplex.data.order import TAIL_POLICIES, Order
from tenplex.ir.files import read_json, write_atomic

STATE_VERSION = 1
FIELDS = ("version", "fingerprint", "seed", "epoch", "cursor", "global_batch", "tail_policy")
_CONFIG = ("fingerprint", "seed", "global_batch", "tail_policy")


def _problem(fields: dict[str, Any]) -> str | None:
    """What is wrong with the state `fields` ("field: message"), or None."""
    if fields["version"] != STATE_VERSION:
        return f"version: expected {STATE_VERSION}, got {fields['version']!r}"
    if not isinstance(fields["fingerprint"], str) or not fields["fingerprint"]:
        return f"fingerprint: expected a non-empty string, got {fields['fingerprint']!r}"
    for name, low in (("seed", 0), ("epoch", 0), ("cursor", 0), ("global_batch", 1)):
        value = fields[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"{name}: expected an integer >= {low}, got {value!r}"
    if fields["tail_policy"] not in TAIL_POLICIES:
        return f"tail_policy: {fields['tail_policy']!r} is not one of {list(TAIL_POLICIES)}"
    if fields["cursor"] % fields["global_batch"]:
        return f"cursor: {fields['cursor']} is not a multiple of global_batch {fields['global_batch']}"
    return None


@attrs.frozen
class DataState:
    fingerprint: str
    seed: int
    global_batch: int
    tail_policy: str = "drop"
    epoch: int = 0
    cursor: int = 0
    version: int = STATE_VERSION

    def __attrs_post_init__(self) -> None:
        problem = _problem(self.to_json())
        if problem:
            raise DataError(f"state: {problem}")

    @classmethod
    def start(cls, index: DatasetIndex, seed: int, global_batch: int, tail_policy: str = "drop") -> DataState:
        """The state before the first step; raises DataError if (index, G, tail) has no step."""
        state = cls(index.fingerprint, seed, global_batch, tail_policy)
        state.order(len(index))
        return state

    def order(self, samples: int) -> Order:
        """The order of an index of `samples` samples. Raises DataError if the cursor is past an epoch."""
        order = Order(samples, self.global_batch, self.seed, self.tail_policy)
        if self.cursor >= order.samples_per_epoch:
            raise DataError(f"cursor: {self.cursor} is not below the {order.samples_per_epoch} samples of an epoch")
        return order

    def order_for(self, index: DatasetIndex, source: str = "state") -> Order:
        """The order over `index`, after checking that the state was made for it."""
        self.check_matches(source, fingerprint=index.fingerprint)
        return self.order(len(index))

    def step(self, order: Order) -> int:
        """The global step that runs next."""
        return self.epoch * order.steps_per_epoch + self.cursor // self.global_batch

    def at_step(self, order: Order, step: int) -> DataState:
        """This job's state just before global step `step`."""
        epoch, k = order.locate(step)
        return attrs.evolve(self, epoch=epoch, cursor=k * self.global_batch)

    def commit(self, order: Order, steps: int = 1) -> DataState:
        """The state after `steps` more optimizer steps are committed."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise DataError(f"steps: expected an integer >= 0, got {steps!r}")
        return self.at_step(order, self.step(order) + steps)

    def consumed_samples(self, order: Order) -> int:
        """epoch x N_eff + cursor: what a trainer's sample counter (LR schedule) must equal."""
        return self.epoch * order.samples_per_epoch + self.cursor

    def check_matches(self, source: str = "state", **config: Any) -> None:
        """Raises DataError naming the first of fingerprint, seed, global_batch, tail_policy
        (given as keywords) that differs from this state, with both values."""
        for name in _CONFIG:
            if name in config and config[name] is not None and config[name] != getattr(self, name):
                raise DataError(
                    f"{source}: {name}: the state has {getattr(self, name)!r} but the job has {config[name]!r}"
                )

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, doc: Any, source: str = "state") -> DataState:
        if not isinstance(doc, dict) or sorted(doc) != sorted(FIELDS):
            got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise DataError(f"{source}: expected an object with the keys {list(FIELDS)}, got {got}")
        problem = _problem(doc)
        if problem:
            raise DataError(f"{source}: {problem}")
        return cls(**doc)

    def save(self, path: str | os.PathLike) -> None:
        """Write the state as JSON to `path` (complete or absent)."""
        write_atomic(path, self.dumps())

    @classmethod
    def load(cls, path: str | os.PathLike) -> DataState:
        return cls.from_json(read_json(path, DataError), str(path))
