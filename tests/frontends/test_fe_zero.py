"""Distributed-optimizer flat buffers (docs/conventions.md §4.2.1)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.frontends.zero import Slot, bucket_layout
from tenplex.ir.errors import SpecError


def test_worked_example_a_b_c_dp2():
    bucket = bucket_layout([("A", 40), ("B", 16), ("C", 4)], 2)
    assert bucket.slots == (Slot("C", 0, 4), Slot("B", 64, 80), Slot("A", 128, 168))
    assert (bucket.numel_unpadded, bucket.numel) == (168, 256)
    assert [bucket.shard_range(r) for r in range(2)] == [(0, 128), (128, 256)]
    assert list(bucket.fragments(0)) == [("C", 0, 4), ("B", 0, 16)]
    assert list(bucket.fragments(1)) == [("A", 0, 40)]


@pytest.mark.parametrize(("shards", "numel"), [(1, 256), (3, 384), (4, 256), (256, 256), (384, 384)])
def test_bucket_end_padded_to_lcm_of_dp_and_128(shards, numel):
    assert bucket_layout([("A", 40), ("B", 16), ("C", 4)], shards).numel == numel


def test_parameter_straddles_shards():
    bucket = bucket_layout([("W", 1000)], 4)  # 1000 -> 1024, shards of 256
    assert [list(bucket.fragments(r)) for r in range(4)] == [
        [("W", 0, 256)],
        [("W", 256, 512)],
        [("W", 512, 768)],
        [("W", 768, 1000)],
    ]


def test_rejects_zero_shards():
    with pytest.raises(SpecError, match="a flat buffer needs >= 1 DP shard, got 0"):
        bucket_layout([("A", 4)], 0)


@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.integers(1, 9))
def test_fragments_cover_each_parameter_once(numels, shards):
    params = [(f"p{i}", n) for i, n in enumerate(numels)]
    bucket = bucket_layout(params, shards)
    seen = {key: [] for key, _ in params}
    for r in range(shards):
        for key, a, b in bucket.fragments(r):
            seen[key].append((a, b))
    for key, n in params:
        spans = sorted(seen[key])
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))
    assert all(s.start % 64 == 0 for s in bucket.slots)
    assert bucket.numel % (128 * shards) == 0 or bucket.numel % 128 == 0 and bucket.numel % shards == 0
