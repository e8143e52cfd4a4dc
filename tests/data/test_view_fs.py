"""The FUSE view's operations without a mount (`ViewFS`): what each call answers before and
after a switch, pinned directories and open files, errors as errno values, and the generation
check of `publish`."""

from __future__ import annotations

import ctypes
import errno
import json
import os

import pytest

from tenplex.data import DataError, DatasetIndex, DataState, Prefetcher, RankFiles, SampleReader, ranges_file, step_file
from tenplex.runtime.fuse import splice
from tenplex.runtime.fuse.dataset import ViewFS
from tests.data.helpers import write_raw_samples


@pytest.fixture
def parts(tmp_path):
    index = write_raw_samples(tmp_path / "s.bin", 40)
    state = DataState.start(index, 3, 8)
    return index, state, SampleReader(index, decode=False)


def paths(ops: ViewFS, files: RankFiles) -> list[str]:
    """The sample files' paths (in the step directories, not the step files)."""
    return [
        f"/{d}/{n}"
        for d in ops.readdir("/", ops.opendir("/"))[5::2]
        for n in ops.readdir(f"/{d}", ops.opendir(f"/{d}"))[2:]
    ]


def read(ops: ViewFS, fh: int, size: int = 1 << 16, offset: int = 0) -> bytes:
    return ops.read("", size, offset, fh)


def test_listing_reading_and_a_switch(parts):
    index, state, reader = parts
    old = RankFiles.build(index, state, 2, 0, 2)
    ops = ViewFS(old, reader)
    root = ops.opendir("/")
    listing = [".", "..", ".state.json", "ranges.bin", "sources", "step-000000", "step-000000.bin", "step-000001",
               "step-000001.bin"]  # fmt: skip
    assert ops.readdir("/", root) == listing
    files = paths(ops, old)
    assert len(files) == 8 and all(
        read(ops, ops.open(p, os.O_RDONLY)) == reader.read(int(p.split("-")[-1][:-4])) for p in files
    )
    fh = ops.open(files[0], os.O_RDONLY)
    new = RankFiles.build(index, state.commit(state.order_for(index), 1), 4, 3, 2, generation=1)
    ops.publish(new)
    assert ops.readdir("/", root) == listing  # pinned
    assert [e[:9] for e in ops.readdir("/", ops.opendir("/"))[2:]] == [".state.js", "ranges.bi", "sources", *["step-0000"] * 4]
    assert read(ops, fh, 3, 1) == reader.read(int(files[0].split("-")[-1][:-4]))[1:4]  # an open file keeps its bytes
    assert ops.getattr(files[0], fh)["st_size"] == index.length[int(files[0].split("-")[-1][:-4])]
    gone = [p for p in files if p not in paths(ops, new)]
    with pytest.raises(OSError) as e:
        ops.getattr(gone[0])
    assert e.value.errno == errno.ENOENT
    state_fh = ops.open("/.state.json", os.O_RDONLY)
    assert json.loads(read(ops, state_fh)) == new.state_doc() and ops.open_flags(state_fh) == (True, False)


@pytest.mark.parametrize(
    ("path", "flags", "code"),
    [("/step-000000", os.O_RDONLY, errno.EISDIR), ("/.state.json", os.O_WRONLY, errno.EROFS),
     ("/step-000009", os.O_RDONLY, errno.ENOENT), ("/step-000000/000-99.bin", os.O_RDONLY, errno.ENOENT),
     ("/step-000009.bin", os.O_RDONLY, errno.ENOENT), ("/step-0.bin", os.O_RDONLY, errno.ENOENT),
     ("/step-000000.bin/x", os.O_RDONLY, errno.ENOENT), ("/step-000000.bin", os.O_WRONLY, errno.EROFS),
     ("/nothing", os.O_RDONLY, errno.ENOENT), ("/sources", os.O_RDONLY, errno.EISDIR),
     ("/sources/000001", os.O_RDONLY, errno.ENOENT), ("/sources/0", os.O_RDONLY, errno.ENOENT),
     ("/sources/000000/x", os.O_RDONLY, errno.ENOENT), ("/ranges.bin", os.O_WRONLY, errno.EROFS),
     ("/sources/000000", os.O_RDWR, errno.EROFS)],
)  # fmt: skip
def test_errors_are_errno_values(parts, path, flags, code):
    index, state, reader = parts
    ops = ViewFS(RankFiles.build(index, state, 2, 0, 2), reader)
    with pytest.raises(OSError) as e:
        ops.open(path, flags)
    assert e.value.errno == code


def test_publish_needs_a_newer_generation(parts):
    index, state, reader = parts
    ops = ViewFS(RankFiles.build(index, state, 2, 0, 2, generation=3), reader)
    with pytest.raises(DataError, match=r"^generation: 3 is not after the current 3$"):
        ops.publish(RankFiles.build(index, state, 1, 0, 2, generation=3))


def test_reads_through_the_prefetcher_and_into_memory(parts):
    index, state, reader = parts
    files = RankFiles.build(index, state, 1, 0, 3)
    with Prefetcher(reader, budget_bytes=1 << 20) as p:
        p.start(files.view, files.stop)
        ops = ViewFS(files, reader, p)
        got = {}
        for path in paths(ops, files):
            fh = ops.open(path, os.O_RDONLY)
            buf = (ctypes.c_char * 64)()
            n = splice.copy_into(ctypes.addressof(buf), ops.read_buf(path, 64, 0, fh))
            got[int(path.split("-")[-1][:-4])] = buf.raw[:n]
            ops.release(path, fh)
        assert got == {i: reader.read(i) for i in files.view.ids_between(0, 3).tolist()}
        assert p.stats().hits + p.stats().waits + p.stats().misses == len(got)


def test_a_vanished_source_file_is_eio(parts, tmp_path):
    index, state, _ = parts
    ops = ViewFS(
        RankFiles.build(index, state, 1, 0, 1), SampleReader(index.with_root(str(tmp_path / "gone")), decode=False)
    )
    for path in (paths(ops, ops.files)[0], "/step-000000.bin"):
        fh = ops.open(path, os.O_RDONLY)
        with pytest.raises(OSError) as e:
            read(ops, fh, 1 << 16, 4096 if path == "/step-000000.bin" else 0)  # past a step file's table
        assert e.value.errno == errno.EIO and "cannot open" in e.value.strerror


def test_a_listing_resolves_its_paths_for_the_current_view_only(parts):
    """READDIRPLUS remembers the listed sample paths (opens then parse nothing); after a switch
    the old view's names are ENOENT again and the new view's open with their own bytes."""
    index, state, reader = parts
    old = RankFiles.build(index, state, 2, 0, 2)
    ops = ViewFS(old, reader)
    listed = ops.readdir_plus("/step-000000", ops.opendir("/step-000000"))[2:]
    assert all(read(ops, ops.open(f"/step-000000/{n}", os.O_RDONLY)) == reader.read(int(n.split("-")[-1][:-4]))
               for n, _ in listed)  # fmt: skip
    new = RankFiles.build(index, state.commit(state.order_for(index), 1), 4, 3, 2, generation=1)
    ops.publish(new)
    gone = [n for n, _ in listed if f"/step-000000/{n}" not in paths(ops, new)]
    with pytest.raises(OSError) as e:
        ops.open(f"/step-000000/{gone[0]}", os.O_RDONLY)
    assert e.value.errno == errno.ENOENT
    stale = ViewFS(old, reader)
    pinned = stale.opendir("/step-000000")
    stale.publish(new)  # a listing of the pinned old view, after the switch, is not remembered for the new one
    assert [n for n, _ in stale.readdir_plus("/step-000000", pinned)[2:]] == [n for n, _ in listed]
    with pytest.raises(OSError) as e:
        stale.open(f"/step-000000/{gone[0]}", os.O_RDONLY)
    assert e.value.errno == errno.ENOENT


def test_a_step_file_is_the_table_then_the_samples_gathered(parts):
    """A step file read in any request size equals its table and the step's samples in order
    (P8), is direct I/O, and keeps its view's bytes across a switch (the name's bytes change)."""
    index, state, reader = parts
    files = RankFiles.build(index, state, 2, 1, 3)
    ops = ViewFS(files, reader)
    listed = dict(ops.readdir_plus("/", ops.opendir("/")))
    fh = ops.open("/step-000001.bin", os.O_RDONLY)
    size = listed["step-000001.bin"]["st_size"]
    whole = read(ops, fh, size + 100)
    got = step_file.parse(whole)
    assert (got.generation, got.step, got.world, got.rank) == (0, 1, 2, 1) and got.ids == files.ids(1)
    assert [bytes(x) for x in got.samples] == [reader.read(i) for i in files.ids(1)]
    assert len(whole) == size == ops.getattr("/step-000001.bin")["st_size"] and ops.open_flags(fh) == (True, False)
    assert all(b"".join(read(ops, fh, n, o) for o in range(0, size, n)) == whole for n in (1, 5, 64, 4096, 4097))
    ops.publish(RankFiles.build(index, state, 4, 3, 3, generation=1))
    assert read(ops, fh, size) == whole
    new = step_file.parse(read(ops, ops.open("/step-000001.bin", os.O_RDONLY), 1 << 16))
    assert (new.generation, new.world, new.rank, new.ids) == (1, 4, 3, ops.files.ids(1))


def test_step_files_read_with_fresh_memory_or_one_kept_buffer(tmp_path):
    small, big = step_file.StepFile(0, 1, 1, 0, (5,), (3,)), step_file.StepFile(0, 2, 1, 0, (7, 8), (5000, 1))
    (tmp_path / "a").write_bytes(small.header() + b"abc")
    (tmp_path / "b").write_bytes(big.header() + (bytes(range(256)) * 20)[:4998] + b"xy!")
    reader = step_file.StepReader(16)  # too small for either: it grows
    for path, ids, tails in [("a", [5], [b"abc"]), ("b", [7, 8], [b"xy", b"!"]), ("a", [5], [b"abc"])]:
        for got in (step_file.read(tmp_path / path), reader.read(tmp_path / path)):
            assert got.ids == ids and [bytes(x)[-2:] for x in got.samples] == [t[-2:] for t in tails]
    with pytest.raises(DataError, match=r"/a: not a tenplex step file"):
        (tmp_path / "a").write_bytes(b"abc")
        reader.read(tmp_path / "a")


def test_parse_refuses_what_is_not_a_step_file():
    good = step_file.StepFile(0, 2, 1, 0, (5, 6), (3, 4))
    data = good.header() + b"abcdefg"
    assert [bytes(x) for x in step_file.parse(data).samples] == [b"abc", b"defg"]
    for bad, why in [(b"x" + data[1:], "not a tenplex step file"), (data[:8] + b"\2" + data[9:], "version 2"),
                     (data[:-1], "4103 bytes, but 4102 were read"), (data[:70], "a table of 2 samples does not fit")]:  # fmt: skip
        with pytest.raises(DataError, match=why):
            step_file.parse(bad, "f")


def test_ranges_name_every_sample_in_its_source_and_keep_their_view(parts, tmp_path):
    """`ranges.bin` lists the view's samples step by step in reading order as (id, source,
    offset, length), each range of `sources/F` holding exactly the sample (P8); a source reads as
    its file (any request size) and names that file as its backing file (passthrough); an open
    table keeps its view across a switch, a new open gets the new one."""
    index, state, reader = parts
    files = RankFiles.build(index, state, 2, 1, 3)
    ops = ViewFS(files, reader)
    root = dict(ops.readdir_plus("/", ops.opendir("/")))
    assert ops.readdir("/sources", ops.opendir("/sources")) == [".", "..", "000000"]
    fh = ops.open("/ranges.bin", os.O_RDONLY)
    whole = read(ops, fh, 1 << 20)
    assert len(whole) == root["ranges.bin"]["st_size"] == ops.getattr("/ranges.bin")["st_size"]
    assert ops.open_flags(fh) == (True, False) and ops.backing(fh) is None
    table = ranges_file.parse(whole)
    assert (table.generation, table.world, table.rank, table.steps, table.sources) == (0, 2, 1, files.steps, 1)
    src = ops.open("/sources/000000", os.O_RDONLY)
    data = (tmp_path / "s.bin").read_bytes()
    assert ops.getattr("/sources/000000")["st_size"] == len(data) and root["sources"]["st_mode"] & 0o040000
    assert all(b"".join(read(ops, src, n, o) for o in range(0, len(data), n)) == data for n in (1, 7, 4096))
    assert os.fstat(ops.backing(src)).st_ino == (tmp_path / "s.bin").stat().st_ino and ops.open_flags(src) == (False, True)
    for step in files.steps:
        ids, sources, offsets, lengths = table.step_rows(step).T.tolist()
        assert ids == files.ids(step) and set(sources) == {0}
        assert [data[o : o + k] for o, k in zip(offsets, lengths)] == [reader.read(i) for i in ids]
    ops.publish(RankFiles.build(index, state, 4, 3, 3, generation=1))
    assert read(ops, fh, 1 << 20) == whole
    new = ranges_file.parse(read(ops, ops.open("/ranges.bin", os.O_RDONLY), 1 << 20))
    assert (new.generation, new.world, new.rank) == (1, 4, 3)
    assert [new.step_rows(s)[:, 0].tolist() for s in new.steps] == [ops.files.ids(s) for s in new.steps]


def test_a_source_behind_a_url_is_read_by_the_view(tmp_path):
    """A source behind a URL has no descriptor to pass through (`backing` is None): its READs
    are served by the view, any request size, cut at the file's end; a bad one is EIO naming it."""
    fsspec = pytest.importorskip("fsspec")
    data = bytes(range(256)) * 3
    fsspec.filesystem("memory").pipe("/view-src/s.bin", data)
    index = DatasetIndex.from_files("raw", "memory://view-src", [("s.bin", len(data), [0, 300], [300, 468])])
    ops = ViewFS(RankFiles.build(index, DataState.start(index, 1, 2), 1, 0), SampleReader(index, decode=False))
    fh = ops.open("/sources/000000", os.O_RDONLY)
    assert ops.backing(fh) is None and ops.getattr("/sources/000000")["st_size"] == len(data)
    assert all(b"".join(read(ops, fh, n, o) for o in range(0, len(data), n)) == data for n in (7, 512, 4096))
    assert read(ops, fh, 100, len(data) - 10) == data[-10:]
    fsspec.filesystem("memory").rm("/view-src/s.bin")
    gone = ViewFS(ops.files, SampleReader(index, decode=False))
    with pytest.raises(OSError) as e:
        read(gone, gone.open("/sources/000000", os.O_RDONLY), 10)
    assert e.value.errno == errno.EIO and "sources/000000" in str(e.value)
