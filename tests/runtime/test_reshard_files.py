"""The offline reshard's files: `map_npy` views, `PlannedFiles` (each dst file written once from
the mapped src; column blocks as `pwritev` runs), `WorkerFiles` (the same by worker processes:
the same errors), `Preallocation` (files allocated ahead, then written over), durability
before the rename, and the same output as the in-memory executor for random layouts
(`tests.problems`)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from tenplex.compiler import CompileOptions, FillOp, compile_plan
from tenplex.ir import loads
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import arange_tensors, materialize, np_dtype, npy_header
from tenplex.runtime.checkpoint import directory, npy, planned, swap, vectored
from tenplex.runtime.checkpoint.apply import plan_values
from tenplex.runtime.checkpoint.directory import CheckpointError, read_checkpoint, relative_paths, write_checkpoint
from tenplex.runtime.checkpoint.npy import map_npy, mapped_file
from tenplex.runtime.checkpoint.planned import PlannedFiles
from tenplex.runtime.checkpoint.prealloc import Preallocation, npy_files
from tenplex.runtime.checkpoint.vectored import runs, write_runs
from tenplex.runtime.checkpoint.workers import WorkerFiles, shares
from tenplex.runtime.reshard import _executed, rehome, reshard
from tests.problems import problems
from tests.security.test_checkpoint_errors import ENOSPC, _tenplex_triple, tiny_disk  # noqa: F401 (a fixture)


def _files_named_by_id(ptc: PTC) -> PTC:
    """`ptc` with each sub-tensor stored under its own id (random layouts share paths)."""
    subs = tuple(attrs.evolve(s, path=s.id) for s in ptc.subtensors)
    return PTC(ptc.tensors, subs, ptc.partitions, ptc.allocation, ptc.topology)


def _src_dir(src: PTC, root: Path) -> tuple[Path, dict]:
    tensors = arange_tensors(src)
    values = {p.id: {n: v.value for n, v in p.values} for p in src.partitions}
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, values, root)
    return root, tensors


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(problems(max_tensors=2))
def test_planned_files_equal_the_executor_for_random_layouts(tmp_path_factory, problem):
    src, dst = (_files_named_by_id(p) for p in problem)
    try:
        relative_paths(src), relative_paths(dst)
    except CheckpointError:
        assume(False)  # an id that is another's directory: not a layout a directory can store
    root, tensors = _src_dir(src, tmp_path_factory.mktemp("src") / "a")
    out = tmp_path_factory.mktemp("out") / "b"
    reshard(root, dst, out)
    ptc, arrays, values = read_checkpoint(out)
    _, src_arrays, src_values = read_checkpoint(root)
    src_h, dst_h = rehome(src, dst, 1)
    plan = compile_plan(src_h, dst_h, CompileOptions(place_ranks=False))
    first = {(sid, src_h.allocation.devices_of(src_h.partition_of[sid])[0]): a for sid, a in src_arrays.items()}
    want_arrays, want_values = _executed([(plan, src_h, dst_h)], first, src_values, 1, 10.0, 10.0, None)
    assert ptc == dst and values == {pid: want_values.get(pid, {}) for pid in values}
    for st in dst.subtensors:
        assert arrays[st.id].tobytes() == want_arrays[st.id].tobytes() == materialize(dst, tensors, st).tobytes(), st.id


WIDE = "gpt-tiny:layers=2,hidden=256,heads=4,ffn=2048,vocab=512,"  # tp4 column blocks of 1-2 KiB rows


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A column split (tp2 -> tp4 cuts some src regions mid-row) and its plan."""
    return _case(tmp_path_factory.mktemp("ck") / "a", "gpt-tiny:")


def _case(root: Path, model: str) -> tuple:
    """(src dir, tensors, dst, the plan's `PlannedFiles`, dst values) of `{model}tp2,pp2` -> tp4."""
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec(f"{model}tp2,pp2@1x4"), ptc_from_spec(f"{model}tp4,pp1@1x4")
    root, tensors = _src_dir(src, root)
    _, arrays, values = read_checkpoint(root, mapped=True)
    src_h, dst_h = rehome(src, dst, 1)
    plan = compile_plan(src_h, dst_h, CompileOptions(place_ranks=False))
    first = {(sid, src_h.allocation.devices_of(src_h.partition_of[sid])[0]): a for sid, a in arrays.items()}
    return root, tensors, dst, PlannedFiles(plan, src_h, dst_h, first), plan_values(plan, values)


def test_map_npy_is_a_read_only_view_of_the_file(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    got = map_npy(tmp_path / "a.npy", "a", CheckpointError)
    assert got.tobytes() == a.tobytes() and not got.flags.writeable
    assert map_npy(tmp_path / "f.npy", "f", CheckpointError).tolist() == a.tolist()
    path, at = mapped_file(got[2:4])
    assert path == tmp_path / "a.npy" and (tmp_path / "a.npy").read_bytes()[at : at + 80] == a[2:4].tobytes()
    assert mapped_file(a) is None and mapped_file(got.copy()) is None
    (tmp_path / "short.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"short\.npy: header claims float32\[6, 10\] \(240 bytes\) but the file holds 236"):
        map_npy(tmp_path / "short.npy", "s", CheckpointError)


def test_map_npy_reads_a_header_longer_than_its_first_read_from_the_file(tmp_path):
    a = np.zeros(3, dtype=[(f"field{i:03d}", "<f4") for i in range(200)])  # a ~5 KiB header (format 1.0)
    np.save(tmp_path / "long.npy", a)
    assert (tmp_path / "long.npy").stat().st_size - a.nbytes > npy._HEAD
    got = map_npy(tmp_path / "long.npy", "l", CheckpointError)
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
    (tmp_path / "cut.npy").write_bytes((tmp_path / "long.npy").read_bytes()[: npy._HEAD + 10])
    with pytest.raises(CheckpointError, match=r"cut\.npy: not a readable \.npy file \(c\)"):
        map_npy(tmp_path / "cut.npy", "c", CheckpointError)


def _write_all(files: PlannedFiles, dst: PTC, values: dict, out: Path, workers: int = 1) -> None:
    directory.write_checkpoint_dir(dst, files if workers == 1 else WorkerFiles(files, workers), values, out)


def _assert_oracle(out: Path, dst: PTC, tensors: dict) -> None:
    _, arrays, _ = read_checkpoint(out)
    for st in dst.subtensors:
        assert arrays[st.id].tobytes() == materialize(dst, tensors, st).tobytes(), st.id


def _counted(monkeypatch) -> tuple[list, list, list]:
    """Bytes copied file to file, written from one buffer, written as runs (`pwritev`)."""
    copied, written, vectored_ = [], [], []
    real_copy, real_pwrite, real_runs = os.copy_file_range, os.pwrite, planned.write_runs
    monkeypatch.setattr(os, "copy_file_range", lambda *a: copied.append(a[2]) or real_copy(*a))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: written.append(len(data)) or real_pwrite(fd, data, at))
    monkeypatch.setattr(planned, "write_runs", lambda fd, s, run, at: vectored_.append(len(s) * run) or real_runs(fd, s, run, at))
    return copied, written, vectored_


@pytest.mark.parametrize("wide", [False, True], ids=["short-rows", "long-rows"])
def test_runs_go_file_to_file_and_column_blocks_are_written_from_the_mapping(case, tmp_path, monkeypatch, wide):
    """Runs of a src file: `copy_file_range`; a column block of one: its rows as `pwritev` runs
    where they are long (gathered into a buffer and written where they are short)."""
    root, tensors, dst, files, values = _case(tmp_path / "src", WIDE) if wide else case
    copied, written, vectored_ = _counted(monkeypatch)
    gathered, real_buffer = [], planned.PlannedFiles._buffer
    monkeypatch.setattr(planned.PlannedFiles, "_buffer",
                        lambda self, name, n: (name != "gather" or not gathered.append(n)) and real_buffer(self, name, n))  # fmt: skip
    _write_all(files, dst, values, tmp_path / "out")
    _assert_oracle(tmp_path / "out", dst, tensors)
    data = sum(dst.nbytes_of(st) for st in dst.subtensors)
    moved = sum(copied) + sum(written) + sum(vectored_)
    assert copied and moved >= data  # every byte once, plus headers and JSON
    assert moved < data + 64 * len(dst.subtensors) + (1 << 20)
    assert sum(vectored_) > 2 * sum(gathered) if wide else not vectored_  # gpt-tiny's rows are all short


def test_runs_are_the_array_in_c_order_and_short_ones_are_left_to_gather(tmp_path):
    a = np.arange(6 * 8 * 600, dtype=np.float32).reshape(6, 8, 600)
    for view in (a[:, 2:5, :300], a[1:4, :, :], a[::2, 1:, 10:350], a[:, 3, :], a[:, ::-1, :]):
        starts, run = runs(view)
        with open(tmp_path / "f", "wb+") as f:
            f.write(b"x" * 16)
            write_runs(f.fileno(), starts, run, 16)
            f.seek(0)
            assert f.read() == b"x" * 16 + np.ascontiguousarray(view).tobytes()
    assert runs(a[:, :, :200]) is None and runs(a[:, :, ::-1]) is None  # 800-byte runs, 4-byte runs: gathered


def test_a_short_vectored_write_is_continued(tmp_path, monkeypatch):
    """`pwritev` may write less than asked (a signal, a nearly full disk): the rest follows,
    also from the middle of a run."""
    a = np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)[:, 128:640]
    real, calls = vectored._pwritev, []

    def short(fd, iov, n, at):  # odd calls: one whole run; even calls: a third of what was asked
        calls.append(n)
        return real(fd, iov, 1, at) if len(calls) % 2 else max(1, real(fd, iov, n, at) // 3)

    monkeypatch.setattr(vectored, "_pwritev", short)
    with open(tmp_path / "f", "wb+") as f:
        write_runs(f.fileno(), *runs(a), 0)
        f.seek(0)
        assert f.read() == a.tobytes() and len(calls) > 4


def test_without_copy_file_range_the_bytes_are_written(case, tmp_path, monkeypatch):
    def cross_device(*args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    root, tensors, dst, files, values = case
    monkeypatch.setattr(os, "copy_file_range", cross_device)
    _write_all(files, dst, values, tmp_path / "out")
    _assert_oracle(tmp_path / "out", dst, tensors)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_a_region_no_op_writes_is_an_error_and_nothing_is_left(case, tmp_path, workers):
    root, tensors, dst, files, values = case
    sid = next(s for s, ops in files.ops.items() if ops and not isinstance(ops[-1], FillOp))
    files.ops[sid], ops = files.ops[sid][:-1], files.ops[sid]
    try:
        with pytest.raises(ExecutionError, match=rf"dst sub-tensor {sid!r}: its ops write \d+ of \d+ bytes"):
            _write_all(files, dst, values, tmp_path / "out", workers)
    finally:
        files.ops[sid] = ops
    assert list(tmp_path.iterdir()) == []


def test_the_tree_is_made_durable_before_the_rename(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(swap, "_syncfs", lambda fd: False)  # the fallback: every file and directory fsynced
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    directory.write_checkpoint_dir(*_tenplex_triple(), tmp_path / "out")
    tmp = [p for p in synced if ".out.tmp-" in p]
    assert len(tmp) == len(list((tmp_path / "out").rglob("*"))) + 1  # every file and directory, before the rename
    assert synced[-1] == str(tmp_path)  # then the rename


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_names_the_file_and_leaves_nothing(case, tiny_disk, workers):  # noqa: F811
    root, _, dst, _, _ = case
    with pytest.raises(CheckpointError, match=rf"{tiny_disk / 'out'}\S*: {ENOSPC}") as info:
        reshard(root, dst, tiny_disk / "out", workers=workers)
    assert "\n" not in str(info.value) and list(tiny_disk.iterdir()) == []


def test_planned_files_are_the_only_copy(case, monkeypatch, tmp_path):
    """One worker never runs the executor: no dst array is allocated in full by it."""
    from tenplex.runtime import executor

    root, tensors, dst, _, _ = case
    monkeypatch.setattr(executor.Executor, "run", lambda *a: pytest.fail("the executor ran"))
    reshard(root, dst, tmp_path / "out")
    _assert_oracle(tmp_path / "out", dst, tensors)


def test_preallocation_allocates_each_file_at_its_size_and_changes_no_byte(tmp_path):
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "outside").write_bytes(b"keep")
    (tmp_path / "out" / "a" / "written.npy").write_bytes(b"x" * 5000)  # a writer got there first
    os.symlink(tmp_path / "outside", tmp_path / "out" / "link.npy")
    files = [("a/written.npy", 5000), ("a/new.npy", 1 << 20), ("link.npy", 1 << 20), ("never.npy", 10)]
    pre = Preallocation(tmp_path / "out", files)
    assert pre.started
    pre.proc.wait(30)
    pre.stop()
    assert (tmp_path / "out" / "a" / "written.npy").read_bytes() == b"x" * 5000
    new = os.stat(tmp_path / "out" / "a" / "new.npy")
    assert new.st_size == 1 << 20 and new.st_blocks * 512 >= 1 << 20  # allocated, not sparse
    assert (tmp_path / "outside").read_bytes() == b"keep"  # a symlink is not followed: the helper stops there
    assert not (tmp_path / "out" / "never.npy").exists()


def test_preallocated_files_are_written_over_and_the_output_is_the_same(case, tmp_path):
    root, tensors, dst, files, values = case
    rel = directory.make_tree(dst, tmp_path / "out")
    pre = Preallocation(tmp_path / "out", npy_files(dst, rel))
    pre.proc.wait(30)
    files.preallocated = True
    try:
        directory.write_checkpoint(dst, files, values, tmp_path / "out")
    finally:
        files.preallocated = False
        pre.stop()
    _assert_oracle(tmp_path / "out", dst, tensors)
    exact = {rel[st.id]: len(npy_header(np_dtype(dst.tensor_map[st.tensor].dtype), st.shape)) + dst.nbytes_of(st)
             for st in dst.subtensors}  # fmt: skip
    assert {str(p.relative_to(tmp_path / "out")): p.stat().st_size for p in (tmp_path / "out").rglob("*.npy")} == exact
    assert all(n <= exact[path] for path, n in npy_files(dst, rel))  # never allocated past a file's end


def test_files_are_shared_out_largest_first_to_the_least_loaded_worker():
    assert shares({"a": 5, "b": 4, "c": 3, "d": 3, "e": 1}, 2) == [["a", "d"], ["b", "c", "e"]]
    assert shares({"a": 1}, 3) == [["a"], [], []]


TWO_FILES = {
    "format": "tenplex.ptc/1",
    "devices": [{"id": 0, "host": "h0"}, {"id": 1, "host": "h0"}],
    "tensors": {"w": {"shape": [8, 4], "dtype": "float32"}},
    "subtensors": {"w/tp0": {"tensor": "w", "path": "w", "box": [[0, 4], [0, 4]]},
                   "w/tp1": {"tensor": "w", "path": "w", "box": [[4, 8], [0, 4]]}},
    "partitions": {"tp0": {"subtensors": ["w/tp0"]}, "tp1": {"subtensors": ["w/tp1"]}},
    "allocation": {"tp0": [0], "tp1": [1]},
}  # fmt: skip


@pytest.mark.multiprocess
def test_more_workers_than_files_write_them_all(tmp_path):
    src = loads(json.dumps(TWO_FILES))  # a worker a file and 3 more: forks only what it needs
    values = {p.id: {} for p in src.partitions}
    root, tensors = _src_dir(src, tmp_path / "a")
    _, arrays, _ = read_checkpoint(root, mapped=True)
    src_h, dst_h = rehome(src, src, 1)
    plan = compile_plan(src_h, dst_h, CompileOptions(place_ranks=False))
    first = {(sid, src_h.allocation.devices_of(src_h.partition_of[sid])[0]): a for sid, a in arrays.items()}
    planned_files = PlannedFiles(plan, src_h, dst_h, first)
    _write_all(planned_files, src, plan_values(plan, values), tmp_path / "out", workers=len(src.subtensors) + 3)
    _assert_oracle(tmp_path / "out", src, tensors)
