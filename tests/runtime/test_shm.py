"""The store served to local processes (`runtime.shm`): shared memory without copies, all-or-nothing
puts, confinement to jobs' state, and a server that outlives bad requests and leaks nothing."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from tenplex.runtime.shm import ShmError, StoreClient, StoreServer
from tenplex.runtime.shm.wire import HEADER, recv, send
from tenplex.runtime.store.shared import Arena, ArenaPool, create_in_arena
from tenplex.runtime.store.tree import TensorStore


@pytest.fixture
def served(tmp_path):
    store = TensorStore()
    server = StoreServer(store, str(tmp_path / "h0.store"), "h0").start()
    yield store, str(tmp_path / "h0.store")
    server.stop()
    store.close()


def test_put_adopts_the_pages_and_get_maps_them(served):
    store, path = served
    with StoreClient(path) as client:
        filled = client.arena({"/job/j/t/0/w": ((4, 3), "float32"), "/job/j/t/0/b": ((3,), "bfloat16"), "/job/j/t/0/s": ((), "int64")})
        filled.views["/job/j/t/0/w"][...] = np.arange(12).reshape(4, 3)
        filled.views["/job/j/t/0/s"][...] = 5
        assert client.put(filled, values={"/job/j/t/0/.values/p/n": [1, "x"]}) == 48 + 6 + 8
        filled.views["/job/j/t/0/w"][0, 0] = 42  # the store holds the very pages: no copy was made
        assert store.get("/job/j/t/0/w")[0, 0] == 42 and store.shared("/job/j/t/0/w") is not None
        got = client.get(["/job/j/t/0/w", "/job/j/t/0/b", "/job/j/t/0/s", "/job/j/t/0/.values/p/n"])
        store.read("/job/j/t/0/w", __import__("tenplex.ir.box", fromlist=["Box"]).Box((1, 0), (2, 3)), writable=True)[...] = -1
        assert got["/job/j/t/0/w"][1].tolist() == [-1, -1, -1]  # the reader maps the store's pages too
        assert not got["/job/j/t/0/w"].flags.writeable and str(got["/job/j/t/0/b"].dtype) == "bfloat16"
        assert got["/job/j/t/0/s"].shape == () and got["/job/j/t/0/s"] == 5 and got["/job/j/t/0/.values/p/n"] == [1, "x"]


def test_leaves_outside_arenas_are_copied_once_and_arenas_are_made_for_many(served):
    store, path = served
    store.put("/job/j/t/1/x", np.arange(5, dtype=np.int32))
    made = create_in_arena(store, [("/job/j/t/1/y", (2, 2), "float64"), ("/job/j/t/1/z", (0,), "float32")], "test")
    assert store.shared("/job/j/t/1/y")[0] is store.shared("/job/j/t/1/z")[0]  # one arena for both
    made[0][0, 1] = 3  # the arrays made are views of the leaves' pages
    assert store.get("/job/j/t/1/y")[0, 1] == 3 and store.shared("/job/j/t/1/y")[1] == 0
    made[0][0, 1] = 0
    with StoreClient(path) as client:
        got = client.get(["/job/j/t/1/x", "/job/j/t/1/y", "/job/j/t/1/z"])
    assert got["/job/j/t/1/x"].tolist() == [0, 1, 2, 3, 4] and got["/job/j/t/1/y"].tolist() == [[0, 0], [0, 0]]
    assert got["/job/j/t/1/z"].shape == (0,)


def test_requests_are_confined_all_or_nothing_and_leave_the_server_serving(served):
    store, path = served
    store.put("/job/j/t/0/w", np.zeros(2))
    with StoreClient(path) as client:
        for bad in (lambda: client.get(["/etc/passwd"]), lambda: client.walk("/"), lambda: client.delete("/job")):
            with pytest.raises(ShmError, match="not under /job/"):
                bad()
        with pytest.raises(ShmError, match="already exists"):
            client.put_arrays({"/job/j/t/0/new": np.ones(3), "/job/j/t/0/w": np.ones(2)})
        assert not store.exists("/job/j/t/0/new")  # nothing of a refused put is kept
        with pytest.raises(ShmError, match="one arena descriptor"):
            client._call("put", items=[], values={})
        loose = os.memfd_create("loose")  # could be shrunk under the store's mapping: refused
        os.ftruncate(loose, 64)
        with pytest.raises(ShmError, match="not sealed against resizing"):
            client._call("put", [loose], items=[["/job/j/t/0/loose", 0, [8], "float64"]], values={})
        os.close(loose)
        assert not store.exists("/job/j/t/0/loose")
        with pytest.raises(ShmError, match="unknown request"):
            client._call("format_disk")
        with pytest.raises(ShmError, match="does not exist"):
            client.get(["/job/j/none"])
        assert client.exists("/job/j/t/0/w")


def test_no_descriptor_leaks_and_a_broken_peer_is_dropped(served):
    store, path = served
    with StoreClient(path) as client:
        client.put_arrays({f"/job/j/t/0/a{i}": np.full(3, i) for i in range(20)})
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(100):
            got = client.get([f"/job/j/t/0/a{i}" for i in range(20)])
            del got
        assert len(os.listdir("/proc/self/fd")) <= before + 2
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(path)
    raw.sendall(HEADER.pack(100, 0) + b"{")  # half a frame, then gone
    raw.close()
    with StoreClient(path) as client:  # the server still serves
        assert client.walk("/job/j/t/0")[:1] == ["/job/j/t/0/a0"]


def test_frames_over_the_limits_are_refused(tmp_path):
    a, b = socket.socketpair()
    with pytest.raises(ShmError, match="over the limits"):
        send(a, "x" * (65 << 20))
    arena = Arena.create(8)
    send(a, {"k": 1}, [arena.fd])
    message, fds = recv(b)
    assert message == {"k": 1} and len(fds) == 1
    assert Arena.adopt(fds[0]).size >= 8
    a.close()
    assert recv(b) is None
    with pytest.raises(ShmError, match="cannot reach"):
        StoreClient(tmp_path / "nobody.store")


def test_a_dropped_tags_arena_is_recycled_only_when_nothing_maps_it(served):
    store, path = served
    pool = ArenaPool()
    items = [(f"/job/j/t/0/{n}", (1000,), "float32") for n in "ab"]
    create_in_arena(store, items, "dst", pool)
    store.read("/job/j/t/0/a", __import__("tenplex.ir.box", fromlist=["Box"]).Box.from_shape((1000,)), writable=True)[...] = 7
    store.delete("/job/j/t")
    assert not pool.waiting  # no view maps it: pooled at once, not set aside
    assert pool.nbytes >= 8000  # no leaf and no view: its pages wait for the next take
    create_in_arena(store, [("/job/j/u/0/a", (1000,), "float32")], "dst", pool)
    assert pool.nbytes == 0 and (store.get("/job/j/u/0/a") == 7).all()  # the same pages, not zeroed
    view = store.get("/job/j/u/0/a")
    store.delete("/job/j/u")
    assert pool.nbytes == 0  # a view still maps it: kept aside, never handed out while it lives
    create_in_arena(store, [("/job/j/v/0/a", (1000,), "float32")], "dst", pool)
    assert (store.get("/job/j/v/0/a") == 0).all() and (view == 7).all()  # a new arena, zero-filled
    store.delete("/job/j/v")  # the pool is full with the one aside: this one is closed
    del view  # the last view gone: its pages are the next take's
    assert pool.nbytes >= 8000
    create_in_arena(store, [("/job/j/w/0/a", (1000,), "float32")], "dst", pool)
    assert (store.get("/job/j/w/0/a") == 7).all()
    store.delete("/job/j/w")
    pool.clear()
    create_in_arena(store, items, "dst", pool)
    with StoreClient(path) as client:
        client.get(["/job/j/t/0/a"])  # its descriptor goes to another process
    store.delete("/job/j/t")
    assert pool.nbytes == 0
    pool.reserve(1 << 20)  # faulted in ahead, kept for a take
    assert pool.nbytes == 1 << 20
    [(fd, size)] = pool.arenas()  # what same-node peers may map ahead (`Runtime.reserve`)
    taken = pool.take(1 << 19)
    assert (taken.fd, taken.size) == (fd, size) == (taken.fd, 1 << 20) and pool.nbytes == 0 and pool.arenas() == []
    del taken  # unused again: back to the pool
    assert pool.nbytes == 1 << 20


def test_an_agent_executes_a_plan_again_in_the_dropped_tags_arena():
    """A repeated execute reuses the pages of the tag dropped before it: the same arena, pooled at
    the drop, never set aside (nothing of the agent's keeps its views) and not a new one to fault in."""
    from tenplex.compiler import compile_plan
    from tenplex.compiler.emit.slices import host_slices
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.agent.agent import Agent
    from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
    from tenplex.runtime.store.layout import tag_path

    src = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp2,pp1,dp1@1x2")
    dst = ptc_from_spec("gpt-tiny:hidden=64,ffn=256,tp1,pp2,dp1@1x2")
    sl = host_slices(compile_plan(src, dst), src, dst, ["h0"])["h0"]
    agent = Agent("h0")
    try:
        agent.load("j", "a", materialize_all(src, arange_tensors(src)), arange_values(src))
        arenas = []
        for epoch in range(3):
            agent.prepare("j", "a", "b", slice=sl, run={"epoch": epoch})
            agent.commit("j", "b")
            leaf = next(p for p in agent.store.walk(tag_path("j", "b")) if "/." not in p)
            arenas.append(os.fstat(agent.store.shared(leaf)[0].fd).st_ino)
            agent.delete_tag("j", "b")
            assert not agent.pool.waiting and agent.pool.nbytes > 0
        assert arenas[1:] == arenas[:1] * 2
    finally:
        agent.stop()


def test_populating_an_arena_never_changes_a_byte():
    import threading

    from tenplex.runtime.store.shared import populate

    arena = Arena.create(3 << 20)
    view = arena.array(0, (3 << 20,), np.uint8)
    view[::4096] = 7  # written before: kept
    populate(arena, chunk=1 << 20)
    view[1::4096] = 9  # written while it may run: kept
    for t in [t for t in threading.enumerate() if t.name == "tenplex-populate"]:
        t.join(10)
    assert (view[::4096] == 7).all() and (view[1::4096] == 9).all() and not view[2::4096].any()


def test_populating_ranges_of_a_mapping_changes_no_byte():
    from tenplex.runtime.store.shared import populate_ranges

    arena = Arena.create(5 * 4096 + 100)
    view = np.frombuffer(arena.map, np.uint8, arena.size)
    view[:] = np.arange(arena.size) % 251
    before = view.copy()
    populate_ranges(view, [(9000, 12000), (0, 1), (4000, 9001), (7, 7), (5 * 4096, arena.size)])  # unsorted, overlapping, empty
    assert np.array_equal(view, before)
    del view
    arena.close()


def test_populating_ranges_faults_in_exactly_their_pages():
    """The pages under the ranges (rounded out to pages, merged) are resident afterwards, and no
    other page of the new memory file is (`mincore`)."""
    import ctypes
    import mmap

    from tenplex.runtime.store.shared import page_runs, populate_ranges

    page = mmap.PAGESIZE
    ranges = [(9000, 12000), (0, 1), (4000, 9001), (7, 7), (6 * page + 5, 6 * page + 6)]  # unsorted, overlapping, empty
    assert page_runs(ranges, page) == [(0, 3 * page), (6 * page, 7 * page)]
    arena = Arena.create(8 * page)
    view = np.frombuffer(arena.map, np.uint8, arena.size)
    populate_ranges(view, ranges)
    resident = (ctypes.c_ubyte * 8)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(arena.size), resident) == 0
    assert [b & 1 for b in resident] == [1, 1, 1, 0, 0, 0, 1, 0]
    del view
    arena.close()
