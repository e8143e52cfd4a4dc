"""`bench.ucx_raw` end to end on small messages: a spawned child sends through raw ucxx and
`UcxPeer` in turns, the parent receives both and checks every byte `UcxPeer` delivered."""

import pytest

pytest.importorskip("ucxx")

from bench.ucx_raw import _order, measure  # noqa: E402


def test_raw_and_peer_take_turns():
    assert [_order(i) for i in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


@pytest.mark.multiprocess
def test_measure_times_both_paths_and_the_copy():
    got = measure([1 << 20, 3 << 20], iters=2)
    assert sorted(got) == [1 << 20, 3 << 20]
    for raw, ours, copy in got.values():
        assert raw > 0 and ours > 0 and copy > 0
