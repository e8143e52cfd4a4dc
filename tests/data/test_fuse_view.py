"""The per-rank FUSE view, read from a child process (`fuse_reader.py`): P8 through FUSE (the
(id, bytes) log equals the oracle's ids and the direct read's bytes, and numpy.load reads every
file), P11 (readers racing switches see one whole view or detect the race; open files and
directories keep their view; the old view's unread files are gone), the prefetched FUSE path,
and `tenplex dataset mount`."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenplex.data import DataError, DatasetIndex, DataState, Prefetcher, RankFiles, SampleReader, Schedule, step_file
from tenplex.runtime.fuse import splice
from tenplex.runtime.fuse.dataset import fuse_unavailable_reason, is_mounted, mount, read_view
from tenplex.runtime.fuse.dataset import view as dataset_view
from tenplex.runtime.fuse.dataset.view import DIRECT_IO_FROM
from tests.data import oracle
from tests.data.helpers import npy_bytes, npz_bytes
from tests.mounts import start_mount

REASON = fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mounting FUSE in tests needs root")
pytestmark = [
    pytest.mark.fuse,
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"FUSE unavailable: {REASON}"),
]
ROOT = Path(__file__).resolve().parents[2]
N_NPY, N_NPZ = 24, 16
N = N_NPY + N_NPZ


def _concat(blobs: list[bytes]) -> tuple[bytes, list[int], list[int]]:
    lengths = [len(b) for b in blobs]
    return b"".join(blobs), list(np.cumsum([0, *lengths[:-1]])), lengths


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> DatasetIndex:
    """N numpy samples: N_NPY `.npy` in a file without a numpy suffix, then N_NPZ `.npz` archives."""
    root = tmp_path_factory.mktemp("fuse_view")
    npy, npy_off, npy_len = _concat([npy_bytes(np.arange(i % 5 + 1, dtype=np.int32) * i) for i in range(N_NPY)])
    npz, npz_off, npz_len = _concat(
        [npz_bytes(x=np.full(i % 3 + 1, i, np.int16), y=np.eye(2) * i) for i in range(N_NPZ)]
    )
    (root / "a.npy-stream").write_bytes(npy)
    (root / "b.npz").write_bytes(npz)
    parts = [("a.npy-stream", len(npy), npy_off, npy_len), ("b.npz", len(npz), npz_off, npz_len)]
    return DatasetIndex.from_files("numpy", str(root), parts)


@pytest.fixture(scope="module")
def child():
    """Send a command to the reader process, get its answer."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuse_reader.py"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip

    def call(**cmd: object) -> object:
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, f"the reader did not answer {cmd}"
        return json.loads(proc.stdout.readline())

    yield call
    proc.stdin.close()
    proc.wait(timeout=30)


def pytest_generate_tests(metafunc) -> None:
    """`server` for each test: both servers, but the default alone for the CLI's mounts (in
    processes of their own, which get the default)."""
    cli = metafunc.function.__name__.startswith("test_cli_mount")
    metafunc.parametrize("server", ["session"] if cli else ["session", "libfuse"], indirect=True)


@pytest.fixture(autouse=True)
def server(request, monkeypatch) -> str:
    """Every mount of this process by the server `request.param` (`pytest_generate_tests`): the
    kernel protocol (`fuse.session`, what a root process gets by default) or libfuse (the
    fallback)."""
    monkeypatch.setitem(dataset_view.mount.__wrapped__.__kwdefaults__, "lowlevel", request.param == "session")
    return request.param


@pytest.fixture
def view(dataset, tmp_path):
    """A mount of its own per test: libfuse keeps one session's signal handlers per process."""
    with mount(dataset, DataState.start(dataset, 1, 4), 1, 0, tmp_path, steps=2) as v:
        yield v


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def loaded_digest(value: object) -> str:
    if isinstance(value, np.ndarray):
        return digest(value.dtype.str.encode() + repr(value.shape).encode() + value.tobytes())
    return digest(b"".join(n.encode() + value[n].tobytes() for n in sorted(value)))


def expected(files: RankFiles) -> dict[str, list]:
    """What the reader must see for `files`: {"step-S/NAME": [sha, size, numpy.load digest]}."""
    reader = SampleReader(files.index)
    out = {}
    for step in files.steps:
        for k, i in enumerate(files.share(step).tolist()):
            name = files.name(k, i, ".npy" if i < N_NPY else ".npz")
            out[f"{files.step_name(step)}/{name}"] = [digest(reader.read(i)), int(files.index.length[i]), loaded_digest(reader[i])]  # fmt: skip
    return out


def expected_steps(files: RankFiles) -> dict[str, list]:
    """What the reader must parse from `files`' step files: {"step-S.bin": [generation, step,
    world, rank, [[id, sha], ...]]} (`fuse_reader.step_file`)."""
    reader, v = SampleReader(files.index), files.view
    return {f"{files.step_name(s)}.bin": [files.generation, s, v.world, v.rank, [[i, digest(reader.read(i))] for i in files.ids(s)]]
            for s in files.steps}  # fmt: skip


def per_sample(got: dict) -> dict[str, list]:
    """The step files' [id, sha] lists as the per-sample files of the same read show them."""
    out: dict[str, list] = {}
    for rel in sorted(got["files"]):
        step, name = rel.split("/")
        out.setdefault(f"{step}.bin", []).append([int(name.split("-")[1].split(".")[0]), got["files"][rel][0]])
    return out


def ids_of(files: dict[str, list]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rel in sorted(files):
        step, name = rel.split("/")
        out.setdefault(int(step[5:]), []).append(int(name.split("-")[1].split(".")[0]))
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_p8_the_fuse_log_is_the_oracle_and_the_direct_read(dataset, view, child, data):
    tail = data.draw(st.sampled_from(["drop", "partial"]))
    g = data.draw(st.sampled_from([4, 8, 12]))
    seed = data.draw(st.integers(0, 2**64 - 1))
    steps = -(-N // g) if tail == "partial" else N // g
    plan = [
        (0, data.draw(st.sampled_from([1, 2]))),
        (data.draw(st.integers(1, steps)), data.draw(st.sampled_from([2, 4]))),
    ]
    want = oracle.run(N, g, seed, tail, plan, steps + 1)
    state = DataState.start(dataset, seed, g, tail)
    order = state.order_for(dataset)
    for a, b, world in Schedule(plan).segments(steps + 1):
        for rank in range(world):
            files = view.switch(state.at_step(order, a), world, rank, steps=b - a)
            got = child(op="view", dir=view.directory)
            assert got["state"] == files.state_doc() and got["files"] == expected(files)
            assert got["steps"] == expected_steps(files)  # a file per step: the same (id, bytes), in order
            assert {k: v[4] for k, v in got["steps"].items() if v[4]} == per_sample(got)
            assert ids_of(got["files"]) == {s: ids for _, s, r, ids in want if a <= s < b and r == rank and ids}


def test_p8_prefetched_fuse_reads(dataset, child, tmp_path):
    reader = SampleReader(dataset, decode=False)
    state = DataState.start(dataset, 3, 8)
    with (
        Prefetcher(reader, budget_bytes=4096, lookahead=2) as p,
        mount(dataset, state, 2, 1, tmp_path, steps=4, prefetcher=p) as v,
    ):
        assert child(op="view", dir=v.directory)["files"] == expected(v.files)
        files = v.switch(state.commit(state.order_for(dataset), 1), 4, 2, steps=3)
        assert child(op="view", dir=v.directory)["files"] == expected(files)
        stats = p.stats()
    assert stats.peak_bytes <= 4096 and stats.mismatched == 0 and stats.hits + stats.waits > 0


def test_step_files_are_the_sample_files_and_the_python_loader(dataset, child, tmp_path):
    """P8 for a file per step: every step file of rank 0 of 3 (G = 12, tail "partial": the last
    step has 4 samples, 2 of them this rank's) holds, bit for bit, the per-sample files' bytes
    and the sequence that the Python loader (`RankBatches`) yields, read with one open and one
    read each (`step_file.read`); the samples of a step lie apart in two source files."""
    torch_data = pytest.importorskip("tenplex.data.torch_data")
    state = DataState.start(dataset, 11, 12, "partial")
    with mount(dataset, state, 3, 0, tmp_path) as v:
        got = child(op="view", dir=v.directory)
        ours = {s: step_file.read(Path(v.directory) / f"{v.files.step_name(s)}.bin") for s in v.files.steps}
        files = v.files
    assert got["steps"] == expected_steps(files) and {k: x[4] for k, x in got["steps"].items()} == per_sample(got)
    loader = torch_data.RankBatches(SampleReader(dataset, decode=False), files.view, len(files.steps), workers=0)
    batches = [(b.step, b.ids.tolist(), [bytes(x) for x in b.samples]) for b in loader]
    assert batches == [(s, b.ids, [bytes(x) for x in b.samples]) for s, b in ours.items()]
    assert [len(b[1]) for b in batches] == [4, 4, 4, 2]  # the odd tail: 4 samples over 3 ranks
    for _, ids, _ in batches:  # each step's samples lie apart in the sources: its replies are gathered
        f, o, n = (a.tolist() for a in dataset.ranges(ids))
        assert any((f[k], o[k] + n[k]) != (f[k + 1], o[k + 1]) for k in range(len(ids) - 1))
    assert any(len({int(dataset.file_id[i]) for i in ids}) == 2 for _, ids, _ in batches)  # one step, two files


def test_the_session_splices_reads_of_source_ranges(dataset, child, tmp_path, monkeypatch):
    """The kernel-protocol server answers READs of sample and step files by splice from the
    sources' page cache (`splice.send`): nothing is copied into a buffer of the serving process."""
    copies: list[tuple] = []
    copy = splice.copy_into
    monkeypatch.setattr(splice, "copy_into", lambda *a: copies.append(a) or copy(*a))
    with mount(dataset, DataState.start(dataset, 1, 4), 1, 0, tmp_path, steps=3, lowlevel=True) as v:
        got = child(op="view", dir=str(tmp_path))
        assert got["steps"] == expected_steps(v.files) and got["files"] == expected(v.files) and copies == []


def test_ranges_read_from_the_sources_are_the_step_files(dataset, child, tmp_path):
    """P8 for ranges + sources: the reader parses `ranges.bin` by its documented layout (no
    tenplex) and reads each sample from `sources/`; every step has the ids and bytes of its step
    file, before and after a switch (the table then names the new view)."""
    with mount(dataset, DataState.start(dataset, 1, 4), 2, 1, tmp_path, steps=3) as v:
        want = expected_steps(v.files)
        assert child(op="ranges", dir=str(tmp_path)) == want == child(op="view", dir=str(tmp_path))["steps"]
        files = v.switch(DataState.start(dataset, 1, 4), 4, 3)
        assert child(op="ranges", dir=str(tmp_path)) == expected_steps(files) != want


def test_the_kernel_reads_the_sources_itself(dataset, child, tmp_path, server):
    """As root, on a kernel with FUSE passthrough, the kernel-protocol server passes the sources
    through: reading every sample by the ranges sends the server no READ of a source; libfuse
    (or no passthrough) serves each read itself."""
    with mount(dataset, DataState.start(dataset, 1, 4), 2, 1, tmp_path, steps=3) as v:
        reads: list[int] = []
        serve = v.ops.read_buf

        def counted(path, size, offset, fh):
            if v.ops._handles[fh].source is not None:
                reads.append(size)
            return serve(path, size, offset, fh)

        v.ops.read_buf = counted
        assert child(op="ranges", dir=str(tmp_path)) == expected_steps(v.files)
        if server == "session" and not v.passthrough:
            pytest.skip("the kernel offers no FUSE passthrough")
        assert (reads == []) == (server == "session") and v.passthrough == (server == "session")


def test_p11_readers_racing_switches_see_one_view_or_detect_the_race(dataset, view, child):
    state = DataState.start(dataset, 9, 12)
    order = state.order_for(dataset)
    layouts = [(state, 2, 0, 2), (state.commit(order), 3, 1, 2), (state, 4, 3, 1)]
    want = [expected(RankFiles.build(dataset, s, w, r, n)) for s, w, r, n in layouts]
    published = {view.switch(*layouts[0][:3], steps=layouts[0][3]).generation: 0}
    done = threading.Event()

    def switch_until_done() -> None:
        while not done.wait(0.01):
            k = len(published) % len(layouts)
            s, w, r, n = layouts[k]
            published[view.switch(s, w, r, steps=n).generation] = k

    switcher = threading.Thread(target=switch_until_done)
    switcher.start()
    try:  # read until the switcher raced the reader a dozen times (a loaded machine switches slowly)
        snaps = child(op="race", dir=view.directory, count=200)
        while len(published) <= 10 and len(snaps) < 2000:
            snaps += child(op="race", dir=view.directory, count=200)
    finally:
        done.set()
        switcher.join()
    step_files = [expected_steps(RankFiles.build(dataset, s, w, r, n)) for s, w, r, n in layouts]
    listings = [{rel.split("/")[0]: sorted(r.split("/")[1] for r in w if r.split("/")[0] == rel.split("/")[0]) for rel in w} for w in want]  # fmt: skip
    shas = {rel: v[0] for w in want for rel, v in w.items()}
    consistent = 0
    for snap in snaps:
        if snap["before"] == snap["after"] and isinstance(snap["before"], int):
            consistent += 1
            assert snap["files"] == {r: v[0] for r, v in want[published[snap["before"]]].items()}
            k = published[snap["before"]]
            assert snap["steps"] == {n: [snap["before"], *v[1:]] for n, v in step_files[k].items()}
        for step, names in snap["dirs"].items():  # every listing is one view's, never a mix
            assert names == "ENOENT" or any(lst.get(step) == names for lst in listings), (step, names)
        for rel, sha in snap["files"].items():  # every file read is the sample its name says
            assert sha == "ENOENT" or sha == shas[rel], rel
        for name, got in snap["steps"].items():  # every step file is one whole view's, naming it
            assert got == "ENOENT" or got[1:] == step_files[published[got[0]]][name][1:], name
    assert consistent > 0 and len(published) > 10


def test_p11_open_files_and_directories_keep_their_view(dataset, view, child):
    state = DataState.start(dataset, 5, 4)
    old = view.switch(state, 1, 0, steps=2)
    new = view.switch(state, 4, 3, steps=2)
    gone = sorted(set(expected(old)) - set(expected(new)))[0]
    old = view.switch(state, 1, 0, steps=2)
    assert child(op="open", path=f"{view.directory}/{gone}") == "ok"
    assert child(op="opendir", path=f"{view.directory}/step-000000") == "ok"
    view.switch(state, 4, 3, steps=2)
    assert child(op="state", dir=view.directory) == view.files.state_doc()  # no stale .state.json
    assert child(op="read_open") == expected(old)[gone][0]
    assert child(op="listdir_open") == sorted(r.split("/")[1] for r in expected(old) if r.startswith("step-000000/"))
    assert child(op="close") == "ok"  # else the unmount waits for the files to close
    assert child(op="cat", path=f"{view.directory}/{gone}") == "ENOENT"  # unread old files are not served


def test_a_bad_switch_changes_nothing(dataset, view):
    before = view.files
    with pytest.raises(DataError, match=r"^world: 3 ranks do not divide global batch 4"):
        view.switch(DataState.start(dataset, 1, 4), 3, 0)
    other = DatasetIndex.from_files("raw", "", [("x", 8, [0], [8])])
    with pytest.raises(DataError, match=r"^state: fingerprint: the state has '[0-9a-f]+' but the job has '[0-9a-f]+'$"):
        view.switch(DataState.start(other, 1, 1), 1, 0)
    assert view.files is before


@pytest.mark.parametrize("direct_io_from", [DIRECT_IO_FROM, 1])  # header + sample through the page cache, or not
def test_megatron_samples_are_npy_files(tmp_path, child, direct_io_from):
    tokens = np.arange(60, dtype=np.uint16)
    (tmp_path / "tok.bin").write_bytes(tokens.tobytes())
    index = DatasetIndex.from_files("megatron", str(tmp_path), [("tok.bin", 120, [0, 20, 60], [20, 40, 60])], "uint16")
    (tmp_path / "mnt").mkdir()
    with mount(
        index, DataState.start(index, 0, 3), 1, 0, tmp_path / "mnt", steps=1, direct_io_from=direct_io_from
    ) as v:
        got = child(op="view", dir=v.directory)
    reader = SampleReader(index)
    want = {
        f"step-000000/{v.files.name(k, i, '.npy')}": loaded_digest(reader[i])
        for k, i in enumerate(v.files.share(0).tolist())
    }
    assert {rel: f[2] for rel, f in got["files"].items()} == want
    ids = v.files.ids(0)
    _, offsets, lengths = (a.tolist() for a in index.ranges(ids))
    raw = [[i, digest(tokens.tobytes()[o : o + n])] for i, o, n in zip(ids, offsets, lengths)]
    assert got["steps"]["step-000000.bin"][4] == raw  # a step file holds the tokens, no .npy headers


def test_large_samples_bypass_the_page_cache_and_read_whole(tmp_path, child):
    """Samples over `DIRECT_IO_FROM` and over one request (`splice.MAX_READ`) read whole, with
    direct I/O (several READs and the one that finds EOF); the smallest through the page cache;
    their step file, of several requests each gathered from pieces of samples, reads whole."""
    sizes = [splice.MAX_READ + 4099, DIRECT_IO_FROM, DIRECT_IO_FROM - 1]
    data = np.random.default_rng(5).integers(0, 256, sum(sizes), dtype=np.uint8).tobytes()
    (tmp_path / "big.bin").write_bytes(data)
    index = DatasetIndex.from_files(
        "raw", str(tmp_path), [("big.bin", len(data), [0, sizes[0], sum(sizes[:2])], sizes)]
    )
    (tmp_path / "mnt").mkdir()
    with mount(index, DataState.start(index, 0, 3), 1, 0, tmp_path / "mnt", steps=1) as v:
        got = child(op="view", dir=v.directory)
        files = got["files"]
        fhs = [v.ops.open(f"/step-000000/{v.files.name(k, i, '.bin')}", os.O_RDONLY)
               for k, i in enumerate(v.files.share(0).tolist())]  # fmt: skip
        flags = {v.ops.getattr("", fh)["st_size"]: v.ops.open_flags(fh) for fh in fhs}
    reader = SampleReader(index)
    assert {rel: f[:2] for rel, f in files.items()} == {
        f"step-000000/{v.files.name(k, i, '.bin')}": [digest(reader.read(i)), sizes[i]]
        for k, i in enumerate(v.files.share(0).tolist())
    }
    assert flags == {sizes[0]: (True, False), sizes[1]: (True, False), sizes[2]: (False, True)}
    assert got["steps"] == expected_steps(v.files)  # one step file of 3 requests, their pieces gathered


# ---- tenplex dataset mount ---------------------------------------------------------------------
def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """`tenplex dataset mount ...` in a subprocess; returns once it printed its 'mounted' line."""
    return start_mount("dataset", "mount", *args)


@pytest.mark.parametrize("page_cache", [False, True])
def test_cli_mount_page_cache_lets_readers_mmap_large_samples_shared(tmp_path, page_cache):
    """A sample of 256 KiB and more is served with direct I/O, which libfuse cannot map shared
    (ENODEV; a private map works; `--page-cache` serves it through the page cache instead); the
    kernel-protocol server that a root process gets maps it shared either way
    (FUSE_DIRECT_IO_ALLOW_MMAP)."""
    blob = npy_bytes(np.arange(DIRECT_IO_FROM // 4, dtype=np.int32))
    (tmp_path / "s.npy-stream").write_bytes(blob)
    DatasetIndex.from_files("numpy", str(tmp_path), [("s.npy-stream", len(blob), [0], [len(blob)])]).save(
        tmp_path / "index.npz"
    )
    (tmp_path / "mnt").mkdir()
    proc, _ = _start(str(tmp_path / "index.npz"), str(tmp_path / "mnt"), "--rank", "0", "--world", "1", "--seed", "0",
                     "--global-batch", "1", "--steps", "1", *(["--page-cache"] if page_cache else []))  # fmt: skip
    try:
        path = tmp_path / "mnt" / "step-000000" / os.listdir(tmp_path / "mnt" / "step-000000")[0]
        code = "import sys, numpy as np\nfor m in 'cr':\n    print(m, int(np.load(sys.argv[1], mmap_mode=m)[-1]))"
        got = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    last = DIRECT_IO_FROM // 4 - 1
    if page_cache or os.geteuid() == 0:
        assert got.stdout == f"c {last}\nr {last}\n", got.stderr
    else:
        assert got.stdout == f"c {last}\n" and "No such device" in got.stderr


@pytest.fixture(scope="module")
def passthrough_offered(dataset, tmp_path_factory) -> bool:
    """Whether a root mount here gets FUSE passthrough (Linux >= 6.9 built with it)."""
    with mount(dataset, DataState.start(dataset, 1, 4), 1, 0, tmp_path_factory.mktemp("probe"), lowlevel=True) as v:
        os.stat(v.directory)
        return v.passthrough


def test_cli_mount_serves_switches_on_sighup_and_stops_on_sigterm(dataset, tmp_path, passthrough_offered):
    dataset.save(tmp_path / "index.npz")
    state = DataState.start(dataset, 2, 4)
    state.save(tmp_path / "state.json")
    (tmp_path / "mnt").mkdir()
    proc, line = _start(str(tmp_path / "index.npz"), str(tmp_path / "mnt"), "--rank", "1", "--world", "2",
                        "--state", str(tmp_path / "state.json"), "--steps", "3")  # fmt: skip
    try:
        through = "; sources/ passed through" if passthrough_offered else ""
        assert line == f"tenplex: mounted rank 1 of 2 at {tmp_path / 'mnt'}: steps 0..2 of {tmp_path / 'index.npz'}{through}\n"
        files = RankFiles.build(dataset, state, 2, 1, 3)
        rel = f"step-000001/{files.name(0, int(files.share(1)[0]), '.npy' if files.share(1)[0] < N_NPY else '.npz')}"
        assert (tmp_path / "mnt" / rel).read_bytes() == SampleReader(dataset).read(int(files.share(1)[0]))
        state.commit(state.order_for(dataset), 2).save(tmp_path / "state.json")
        proc.send_signal(signal.SIGHUP)
        assert proc.stdout.readline() == "tenplex: switched to steps 2..4 (generation 1)\n"
        assert json.loads((tmp_path / "mnt" / ".state.json").read_text())["step"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not is_mounted(str(tmp_path / "mnt"))


def test_cli_mount_reloads_a_relative_state_from_its_own_cwd(dataset, tmp_path):
    """Issue 12 item 1: a relative --state was re-read on SIGHUP after FUSE changed the cwd to `/`."""
    (cwd := tmp_path / "cwd").mkdir()
    dataset.save(cwd / "index.npz")
    state = DataState.start(dataset, 2, 4)
    state.save(cwd / "state.json")
    (cwd / "mnt").mkdir()
    proc, _ = start_mount("dataset", "mount", "index.npz", "mnt", "--rank", "0", "--world", "2",
                          "--state", "state.json", "--steps", "3", cwd=cwd)  # fmt: skip
    try:
        state.commit(state.order_for(dataset), 2).save(cwd / "state.json")
        proc.send_signal(signal.SIGHUP)
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == "tenplex: switched to steps 2..4 (generation 1)\n"
        assert json.loads((cwd / "mnt" / ".state.json").read_text())["step"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "error" not in err, err
    assert not is_mounted(str(cwd / "mnt"))


def test_cli_mount_never_serves_a_file_outside_the_index_root(tmp_path):
    """Issue 12 item 13: an index entry that resolves outside its root (a symlink) was served."""
    (root := tmp_path / "ds").mkdir()
    secret = npy_bytes(np.full(3, 7, np.int64))
    (tmp_path / "secret.npy").write_bytes(secret)
    (root / "a.npy").symlink_to(tmp_path / "secret.npy")
    (root / "b.npy").write_bytes(ok := npy_bytes(np.arange(2)))
    parts = [("a.npy", len(secret), [0], [len(secret)]), ("b.npy", len(ok), [0], [len(ok)])]
    DatasetIndex.from_files("numpy", str(root), parts).save(tmp_path / "index.npz")
    (mnt := tmp_path / "mnt").mkdir()
    proc, _ = start_mount("dataset", "mount", str(tmp_path / "index.npz"), str(mnt), "--rank", "0", "--world", "1",
                          "--seed", "0", "-G", "2", "--steps", "1")  # fmt: skip
    try:
        served, refused = [], []
        for f in sorted((mnt / "step-000000").iterdir()):
            try:
                served.append(f.read_bytes())
            except OSError as e:
                refused.append(e.errno)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert served == [ok] and refused == [5]  # EIO
    assert not is_mounted(str(mnt))


def test_cli_mount_errors_are_one_line(dataset, tmp_path):
    dataset.save(tmp_path / "index.npz")
    run = lambda *a: subprocess.run([sys.executable, "-m", "tenplex.cli", "dataset", "mount", str(tmp_path / "index.npz"),  # noqa: E731
                                     str(tmp_path), *a], capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    r = run("--rank", "2", "--world", "2", "--seed", "1", "-G", "4")
    assert r.returncode == 2 and r.stderr == "tenplex: error: rank: 2 is not in 0..1\n"
    r = run("--rank", "0", "--world", "2", "--seed", "1")
    assert r.returncode == 2 and r.stderr.startswith("tenplex: error: give --state STATE, or --seed and --global-batch")


def test_read_view_in_the_serving_process(dataset, view):
    """Plain Python I/O may read the mount from the process that serves it (numpy's may not)."""
    files = view.switch(DataState.start(dataset, 4, 4), 2, 1, steps=3)
    state, got = read_view(view.directory)
    assert state == files.state_doc()
    assert {rel: [digest(data), len(data)] for rel, data in got.items()} == {
        r: v[:2] for r, v in expected(files).items()
    }
