"""Parts between agents on one node by one copy into the receiver's shared memory (`agent.direct`),
in one process: the receiver's real offer of its arena, mapped again through /proc like a peer
does, the sender's copies checked byte for byte; refusals, mismatches and unmappable offers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tenplex.compiler import compile_plan
from tenplex.compiler.emit.slices import host_slices
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import direct
from tenplex.runtime.agent.files import dst_arrays
from tenplex.runtime.agent.rounds import Execution
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.store.shared import Arena
from tenplex.runtime.store.tree import TensorStore


def _execution(host: str, sl: dict, store: TensorStore, adopt: bool = True) -> Execution:
    """`host`'s execution with src arrays of distinct bytes and its dst arrays made as `Agent.prepare`
    does, store leaves already unless not `adopt` (`rounds.run` makes them while the offers travel)."""
    ex = Execution(host, "j", "a", "b", sl)
    made, ex.pending, ex.places = dst_arrays(store, ex, {}, None)
    if adopt:
        ex.adopt()
    src = {i: np.frombuffer(np.random.default_rng(i).bytes(int(np.prod(shape)) * np_dtype(dtype).itemsize), np_dtype(dtype))
           .reshape(shape) for i, (side, _, _, dtype, shape) in enumerate(ex.meta) if side == "src"}  # fmt: skip
    ex.arrays = [src[i] if i in src else made[i] for i in range(len(ex.meta))]
    return ex


@pytest.fixture(scope="module")
def pair():
    src = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp2,pp1,dp1@2x1")
    dst = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp1,pp2,dp1@2x1")
    plan = compile_plan(src, dst)
    return host_slices(plan, src, dst, ["h0", "h1"])


def _parts(ex: Execution, outgoing: bool) -> list:
    return [p for r in sorted(ex.sliced.network) for p in ex.sliced.network[r] if p.outgoing == outgoing]


def _offered(sender: Execution, receiver: Execution, store: TensorStore) -> np.ndarray:
    """h1's offer for h0's parts, received into the buffer h0 sizes for it (as over UCX)."""
    made = direct.offer(receiver, _parts(receiver, False))
    got = np.zeros(direct.capacity(sender, _parts(sender, True)), "<i8")
    assert made.size <= got.size
    got[: made.size] = made
    return got


HEAD_ROWS = 2  # an offer's header: pid, arenas, rows, sure


def test_a_sender_copies_every_part_into_the_receivers_arena_once(pair):
    s0, s1 = TensorStore(), TensorStore()
    h0, h1 = _execution("h0", pair["h0"], s0), _execution("h1", pair["h1"], s1)
    parts = _parts(h0, True)
    assert parts and any(not p.in_place for p in _parts(h1, False))  # strided regions on the receiving side
    sure = direct.offer(h1, _parts(h1, False), sure=True)  # asks for no answer; the same regions
    assert sure[3] == 1 and np.array_equal(np.delete(sure, 3), np.delete(direct.offer(h1, _parts(h1, False)), 3))
    early = _execution("h1", pair["h1"], TensorStore(), adopt=False)  # no store leaf yet: an offer all the same
    assert early.pending is not None and direct.offer(early, _parts(early, False))[1] == 1
    maps = direct.Mappings()
    views = maps.views(h0, "h1", _offered(h0, h1, s1), parts)
    assert views is not None and len(maps.maps) == 1  # h1's one dst arena, mapped a second time
    for p in parts:
        direct.copy(h0, p, views[p.tag])
    into = {p.tag: p for p in _parts(h1, False)}
    for p in parts:  # every byte where h1 reads it, region by region in op order
        assert into[p.tag].nbytes == p.nbytes
        for mine, theirs in zip(p.regions, into[p.tag].regions, strict=True):
            assert h1.view(theirs).tobytes() == h0.view(mine).tobytes()
    maps.keep_only()  # this execution's mapping is kept for the next one
    assert len(maps.maps) == 1
    again = _offered(h0, h1, s1)
    assert maps.views(h0, "h1", again, parts) is views  # the same offer again: its views are not rebuilt
    again[HEAD_ROWS] += 1  # another offer (here: one more region than h0 sends) is parsed anew, and checked
    with pytest.raises(ExecutionError, match="regions"):
        maps.views(h0, "h1", again, parts)
    maps.keep_only()
    maps.keep_only()  # the next one named no arena: unmapped, its views forgotten
    assert maps.maps == {} and maps.last == {}
    maps.close()


def test_refusals_and_mismatches(pair, tmp_path):
    s0, s1 = TensorStore(), TensorStore()
    h0, h1 = _execution("h0", pair["h0"], s0), _execution("h1", pair["h1"], s1)
    parts = _parts(h0, True)
    maps = direct.Mappings()
    # a receiver whose dst arrays are not in an arena (made one by one under a memory budget) refuses
    budget = TensorStore(memory_budget_bytes=1, spill_dir=str(tmp_path))
    spilled = _execution("h1", pair["h1"], budget)
    assert direct.offer(spilled, _parts(spilled, False))[1] == -1
    assert maps.views(h0, "h1", _offered(h0, spilled, budget), parts) is None
    # an offer naming an arena this process cannot map as described: no mapping, UCX instead
    got = _offered(h0, h1, s1)
    wrong = got.copy()
    wrong[direct.HEAD + 1] += 1  # another inode
    assert maps.views(h0, "h1", wrong, parts) is None
    gone = got.copy()
    gone[0] = 2**22 + 12345  # no such process
    assert maps.views(h0, "h1", gone, parts) is None
    assert maps.maps == {}
    # an offer that does not describe the sender's parts is a protocol error, named
    bad = got.copy()
    bad[direct.HEAD + direct.ARENA * int(got[1])] += 1  # the first region's part tag
    with pytest.raises(ExecutionError, match=r"message \d+ \(h0 -> h1, round 0.*peer 'h1' offered region"):
        maps.views(h0, "h1", bad, parts)
    maps.close()


def test_a_mapping_is_the_peers_sealed_memory_checked_by_inode():
    arena = Arena.create(1 << 16)
    st = os.fstat(arena.fd)
    maps = direct.Mappings()
    view = maps._map(os.getpid(), arena.fd, st.st_ino, st.st_dev, arena.size)
    view[:5] = [1, 2, 3, 4, 5]
    assert bytes(arena.map[:5]) == b"\x01\x02\x03\x04\x05"
    assert maps._map(os.getpid(), arena.fd, st.st_ino + 1, st.st_dev, arena.size) is None
    assert maps._map(os.getpid(), arena.fd, st.st_ino, st.st_dev, arena.size * 2) is None  # larger than the file
    unsealed = os.memfd_create("x", os.MFD_CLOEXEC)  # the right file, but resizable: refused
    os.ftruncate(unsealed, 1 << 16)
    st = os.fstat(unsealed)
    assert maps._map(os.getpid(), unsealed, st.st_ino, st.st_dev, 1 << 16) is None
    os.close(unsealed)
    maps.close()
    arena.close()


def test_a_premapped_arena_is_neither_mapped_nor_populated_again_by_the_offer(pair, monkeypatch):
    """`Mappings.premap` (`Runtime.reserve`): the receiver's arena mapped with its page tables
    filled before the execution, whose offer then maps and populates nothing; arenas it cannot
    map as described are skipped; one that no offer names is unmapped at the next `keep_only`."""
    s0, s1 = TensorStore(), TensorStore()
    h0, h1 = _execution("h0", pair["h0"], s0), _execution("h1", pair["h1"], s1)
    parts = _parts(h0, True)
    got = _offered(h0, h1, s1)
    pid, fd, ino, dev, size = (int(x) for x in (got[0], *got[direct.HEAD : direct.HEAD + direct.ARENA]))
    populated: list[int] = []
    monkeypatch.setattr(direct, "populate_ranges", lambda view, ranges: populated.append(view.nbytes))
    maps = direct.Mappings()
    spare = Arena.create(1 << 16)  # pooled, never offered
    st = os.fstat(spare.fd)
    assert maps.premap([[pid, fd, ino + 1, dev, size], [2**22 + 12345, fd, ino, dev, size]]) == 0  # not as described
    assert maps.premap([[pid, fd, ino, dev, size], [pid, spare.fd, st.st_ino, st.st_dev, spare.size]]) == size + spare.size
    assert populated == [size, spare.size] and len(maps.maps) == 2
    assert maps.premap([[pid, fd, ino, dev, size]]) == 0  # mapped already
    views = maps.views(h0, "h1", got, parts)
    assert views is not None and populated == [size, spare.size] and maps.populated == 0  # no new mapping
    for p in parts:
        direct.copy(h0, p, views[p.tag])
    into = {p.tag: p for p in _parts(h1, False)}
    assert all(h1.view(t).tobytes() == h0.view(m).tobytes() for p in parts for m, t in zip(p.regions, into[p.tag].regions))
    maps.keep_only()  # the offered arena stays, the spare one goes
    assert set(maps.maps) == {(pid, ino, dev)}
    fresh = direct.Mappings()  # without the premap, the offer maps the arena and fills its page tables
    assert fresh.views(h0, "h1", got, parts) is not None and fresh.populated > 0 and len(populated) == 3
    maps.close()
    fresh.close()
    spare.close()


def test_src_arrays_come_from_the_store_in_one_call_checked_against_the_slice(pair):
    from tenplex.runtime.agent import rounds

    store = TensorStore()
    sl = Execution("h0", "j", "a", "b", pair["h0"]).sliced
    indices, paths = sl.paths("j", "a", "src")
    assert sl.paths("j", "a", "src") is sl.paths("j", "a", "src") and paths[0].startswith("/job/j/a/")  # made once
    with pytest.raises(ExecutionError, match=f"src array {paths[0]} is missing"):
        rounds.sources(store, sl, "j", "a")
    for i, path in zip(indices, paths):
        store.put(path, np.zeros(sl.shapes[i], sl.dtypes[i]))
    got = rounds.sources(store, sl, "j", "a")
    assert sorted(got) == sorted(indices) and not any(a.flags.writeable for a in got.values())
    store.put(paths[-1], np.zeros(3, np.int8), replace=True)
    with pytest.raises(ExecutionError, match=f"src array {paths[-1]} is int8\\[3\\], the plan reads"):
        rounds.sources(store, sl, "j", "a")


def test_local_copies_between_contiguous_regions_copy_byte_ranges_checked_for_shape_and_bounds(pair, monkeypatch):
    """`rounds.local`: a copy between C-contiguous regions of one dtype is a copy of byte ranges
    (`Execution.flat`), the rest go through `np.copyto` of strided views; every byte lands where
    the region says. A region of another shape, or outside its array, fails, named, as with
    strided views."""
    from tenplex.runtime.agent import rounds

    ex = _execution("h0", pair["h0"], TensorStore())
    rows = [row for r in sorted(ex.sliced.batches) for batch in ex.sliced.batches[r] for row in batch]
    views = ex.sliced.views
    flat = [row for row in rows if views[row[3]].contiguous and views[row[4]].contiguous]
    assert flat and len(flat) < len(rows)  # both kinds in this plan
    calls = []
    copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src: (calls.append(dst.shape), copyto(dst, src)))
    for r in sorted(ex.sliced.batches):
        for _ in rounds.local(ex, ex.sliced.batches[r]):
            pass
    assert len(calls) == len(rows) - len(flat)
    for row in rows:
        assert ex.view(row[4]).tobytes() == ex.view(row[3]).tobytes()
    row = next(r for r in flat if len(views[r[4]].shape) > 1)
    d = views[row[4]]  # the same bytes as one row: a region of another shape is refused, not copied
    ex.sliced.views = [d._replace(shape=(d.nbytes // d.strides[-1],), strides=d.strides[-1:]) if i == row[4] else v
                       for i, v in enumerate(views)]  # fmt: skip
    with pytest.raises(ExecutionError, match=rf"message {row[1]} .*op {row[2]} failed"):
        for _ in rounds.local(ex, [[row]]):
            pass
    past = {i: views[i]._replace(offset=ex.arrays[views[i].array].nbytes - views[i].nbytes + 1) for i in row[3:5]}
    ex.sliced.views = [past.get(i, v) for i, v in enumerate(views)]  # both one byte past their array's end
    with pytest.raises(ExecutionError, match=rf"message {row[1]} .*op {row[2]} failed"):
        for _ in rounds.local(ex, [[row]]):
            pass


def test_an_agent_premaps_only_the_pooled_arenas_of_peers_on_its_node():
    """`Agent.premap` (from `Runtime.reserve`): arenas of peers it reaches by shared memory are
    mapped; those of peers over TCP (another node) or not connected are left alone, so no agent
    keeps another node's memory mapped."""
    from types import SimpleNamespace

    from tenplex.runtime.agent.agent import Agent

    agent = Agent("h0")
    arena = Arena.create(1 << 16)
    st = os.fstat(arena.fd)
    row = [os.getpid(), arena.fd, st.st_ino, st.st_dev, arena.size]
    agent.endpoints = {"near": SimpleNamespace(mode="address"), "far": SimpleNamespace(mode="tcp")}
    try:
        assert agent.premap({"far": [row], "unknown": [row]}) == 0 and agent.maps.maps == {}
        assert agent.premap({"near": [row]}) == arena.size and len(agent.maps.maps) == 1
    finally:
        agent.endpoints = {}
        agent.stop()
        arena.close()
