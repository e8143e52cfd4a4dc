"""`tenplex._gc.without_gc`: the collector paused for a block and restored after it, what the block
allocated moved to the oldest generation, and a process's own frozen objects left frozen."""

import gc

import pytest

from tenplex._gc import without_gc


@pytest.fixture
def collector():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_paused_in_the_block_and_restored_after(collector):
    seen = without_gc(gc.isenabled)()
    assert seen is False and gc.isenabled()
    gc.disable()
    assert without_gc(lambda: 1)() == 1 and not gc.isenabled()  # a paused collector stays paused


def test_only_the_outermost_block_re_enables(collector):
    inner = without_gc(gc.isenabled)
    assert without_gc(lambda: (inner(), gc.isenabled()))() == (False, False)
    assert gc.isenabled()


def test_what_the_block_allocated_goes_to_the_oldest_generation(collector):
    made = without_gc(lambda: [[i] for i in range(100)])()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(x) in oldest for x in made)


def test_a_process_s_own_frozen_objects_stay_frozen(collector):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        without_gc(lambda: [[i] for i in range(100)])()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_the_block_s_exception_passes_and_the_collector_is_back(collector):
    def fail():
        raise KeyError("x")

    with pytest.raises(KeyError):
        without_gc(fail)()
    assert gc.isenabled()
