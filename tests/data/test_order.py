"""Order stream v1: pinned by goldens and by an independent Philox; batches, tails, epochs (P7)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.data import DataError, Order, epoch_order
from tests.data import oracle

# The stream must never change: these are what order stream v1 produced when it was written.
GOLDEN = [
    pytest.param(0, 0, 10, [2, 5, 3, 7, 9, 1, 0, 6, 4, 8], id="seed0_epoch0"),
    pytest.param(2024, 3, 12, [6, 10, 3, 1, 2, 9, 7, 4, 5, 8, 11, 0], id="seed2024_epoch3"),
]


@pytest.mark.parametrize(("seed", "epoch", "n", "expected"), GOLDEN)
def test_order_stream_v1_is_pinned(seed, epoch, n, expected):
    assert epoch_order(seed, epoch, n).tolist() == expected


def test_numpy_philox_is_the_philox_of_the_spec():
    key = 288110419727773279764639506889947201023  # sha256("tenplex.data.order/1:0:0")[:16], little-endian
    assert np.random.Philox(key=key).random_raw(9).tolist() == oracle.philox_raw(key, 9)
    assert oracle.philox_raw(key, 2) == [0x873ABB03F2CD99C8, 0x7297E16DE2FB4D22]


@given(st.integers(0, 2**64 - 1), st.integers(0, 1000), st.integers(0, 150))
def test_epoch_order_equals_the_oracle(seed, epoch, n):
    assert epoch_order(seed, epoch, n).tolist() == list(oracle.permutation(seed, epoch, n))


def test_epoch_order_is_read_only():
    with pytest.raises(ValueError):
        epoch_order(1, 0, 5)[0] = 3


@given(st.integers(0, 2**64 - 1), st.integers(12, 80))
def test_p7_next_epoch_and_other_seed_change_the_order(seed, n):
    assert epoch_order(seed, 0, n).tolist() != epoch_order(seed, 1, n).tolist()
    assert epoch_order(seed, 0, n).tolist() != epoch_order(seed ^ 1, 0, n).tolist()


TAILS = [  # (N, G, tail) -> steps per epoch, N_eff, batch sizes of epoch 0, dropped count
    pytest.param(12, 4, "drop", 3, 12, [4, 4, 4], 0, id="divisible_drop"),
    pytest.param(12, 4, "partial", 3, 12, [4, 4, 4], 0, id="divisible_partial"),
    pytest.param(10, 4, "drop", 2, 8, [4, 4], 2, id="drop_tail_2"),
    pytest.param(10, 4, "partial", 3, 10, [4, 4, 2], 0, id="partial_tail_2"),
    pytest.param(3, 5, "partial", 1, 3, [3], 0, id="partial_g_above_n"),
    pytest.param(7, 7, "drop", 1, 7, [7], 0, id="one_step"),
]


@pytest.mark.parametrize(("n", "g", "tail", "steps", "n_eff", "sizes", "n_dropped"), TAILS)
def test_tail_policies(n, g, tail, steps, n_eff, sizes, n_dropped):
    order = Order(n, g, 5, tail)
    assert (order.steps_per_epoch, order.samples_per_epoch) == (steps, n_eff)
    assert [len(order.batch(s)) for s in range(steps)] == sizes == [order.batch_size(s) for s in range(steps)]
    assert len(order.dropped(0)) == n_dropped
    epoch = np.concatenate([order.batch(s) for s in range(steps)] + [order.dropped(0)])
    assert epoch.tolist() == order.epoch(0).tolist()
    assert order.batch(steps).tolist() == order.epoch(1)[: sizes[0]].tolist()
    assert order.locate(2 * steps + 1 if steps > 1 else 2) == ((2, 1) if steps > 1 else (2, 0))


@given(st.integers(1, 40), st.integers(1, 12), st.sampled_from(["drop", "partial"]), st.integers(0, 10))
def test_consumed_samples_counts_epochs_and_cursor(n, g, tail, step):
    if tail == "drop" and g > n:
        return
    order = Order(n, g, 0, tail)
    per = order.steps_per_epoch
    assert order.consumed_samples(step) == sum(order.batch_size(s) for s in range(step))
    assert order.consumed_samples(step) == (step // per) * order.samples_per_epoch + (step % per) * g


BAD = [
    pytest.param(
        lambda: Order(4, 5, 0, "drop"),
        "global_batch: 5 exceeds the 4 samples of the index, so tail policy 'drop' leaves no step",
        id="g_above_n_drop",
    ),
    pytest.param(
        lambda: Order(4, 2, 0, "pad"), "tail_policy: 'pad' is not one of ['drop', 'partial']", id="unknown_tail"
    ),
    pytest.param(lambda: Order(0, 1, 0), "samples: expected an integer >= 1, got 0", id="empty_index"),
    pytest.param(lambda: Order(4, 0, 0), "global_batch: expected an integer >= 1, got 0", id="zero_batch"),
    pytest.param(lambda: Order(4, 2, -1), "seed: expected an integer >= 0, got -1", id="negative_seed"),
    pytest.param(lambda: Order(4, 2, 2**64), "seed: expected an integer below 2**64", id="huge_seed"),
    pytest.param(lambda: Order(4, 2, 0).locate(-1), "step: expected an integer >= 0, got -1", id="negative_step"),
    pytest.param(lambda: epoch_order(0, -1, 3), "epoch: expected an integer >= 0, got -1", id="negative_epoch"),
]


@pytest.mark.parametrize(("make", "message"), BAD)
def test_bad_orders_name_the_field(make, message):
    with pytest.raises(DataError, match="^" + re.escape(message)):
        make()
