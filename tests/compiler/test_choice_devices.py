"""`choice.devices.by_steps` (hosts' atoms taken in steps) against the choice one atom at a time."""

from __future__ import annotations

import numpy as np
import pytest

from tenplex.compiler.passes.choice import devices as least_loaded


def _one_at_a_time(which, bounds, devices, before, sizes, sent):
    """The definition: atom by atom, the first least `before + sent` candidate; its device's
    count then grows by the atom's size."""
    sent, chosen, at = list(sent), [], 0
    for x, size in zip(which, sizes):
        ds = devices[bounds[x] : bounds[x + 1]]
        loads = [before[at + j] + sent[d] for j, d in enumerate(ds)]
        at += len(ds)
        i = loads.index(min(loads))
        chosen.append(bounds[x] + i)
        sent[ds[i]] += size
    return chosen


@pytest.mark.parametrize("seed", range(40))
def test_by_steps_chooses_as_one_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    hosts, per_host = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    keys = int(rng.integers(1, 8))
    host_of_key = rng.integers(0, hosts, keys)
    # each key: some devices of its host (distinct, ascending), at least one
    runs = [sorted(rng.choice(per_host, int(rng.integers(1, per_host + 1)), replace=False) + h * per_host)
            for h in host_of_key.tolist()]  # fmt: skip
    bounds = np.concatenate(([0], np.cumsum([len(r) for r in runs]))).astype(np.int64)
    devices = np.array([d for r in runs for d in r], np.int64)
    m = int(rng.integers(0, 30))
    which = rng.integers(0, keys, m)
    small = int(rng.integers(1, 4))  # small values: many ties
    before = rng.integers(0, small, int((bounds[which + 1] - bounds[which]).sum()))
    sizes = rng.integers(1, small + 1, m)
    sent = rng.integers(0, small, hosts * per_host + int(rng.integers(0, 3))).tolist()
    got = least_loaded.by_steps(host_of_key[which], which, bounds, devices, before, sizes, sent)
    assert got.tolist() == _one_at_a_time(which.tolist(), bounds.tolist(), devices.tolist(), before.tolist(), sizes.tolist(), sent)
