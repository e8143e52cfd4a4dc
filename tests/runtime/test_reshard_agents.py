"""`reshard --workers N` (N >= 2): worker processes each write their share of the dst files
straight from the src files; with `--central`, agents map the src `.npy` files and execute into
dst files that they create and map themselves (`agent.files`). A worker or agent that dies
leaves no OUT and the src intact, with an error naming it; the command (one or two workers)
starts without the modules it does not need.

Real agents (`Agent` in-process for the file commands, `Runtime.local` processes for the
rest), real worker processes, real checkpoint directories written by `write_checkpoint`."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.ir.serialize import dumps
from tenplex.runtime.agent.agent import Agent
from tenplex.runtime.agent.files import create_mapped
from tenplex.runtime.arrays import arange_tensors, materialize
from tenplex.runtime.checkpoint import directory
from tenplex.runtime.checkpoint.directory import read_checkpoint, relative_paths, write_checkpoint
from tenplex.runtime.checkpoint.npy import load_npy, mapped_file
from tenplex.runtime.reshard import reshard
from tenplex.runtime.store.layout import array_path
from tenplex.runtime.transport.ucx import ucx_available

SRC, DST = "gpt-tiny:tp2,pp2@1x4", "gpt-tiny:tp4,pp1@1x4"
UCX = pytest.mark.skipif(ucx_available() is not None, reason=f"ucxx cannot be imported: {ucx_available()}")
FAST = {"timeout": 20.0, "round_timeout": 60.0}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    src, dst = ptc_from_spec(SRC), ptc_from_spec(DST)
    tensors = arange_tensors(src)
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in src.partitions}
    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, values, root / "a")
    return src, dst, tensors, root / "a"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(src, a: Path) -> dict[tuple[str, int], list]:
    rel = relative_paths(src)
    return {(st.id, 0): [str(a / rel[st.id]), src.tensor_map[st.tensor].dtype, list(st.shape)] for st in src.subtensors}


@pytest.mark.timeout(60)
def test_agent_maps_src_files_and_creates_mapped_dst_files(case, tmp_path):
    src, _, tensors, a = case
    agent = Agent("h0")
    try:
        n = agent.load_files("j", "src", _rows(src, a), {("p", 0): {"iteration": 3}})
        assert n == sum(materialize(src, tensors, st).nbytes for st in src.subtensors)
        st = src.subtensors[1]
        got = agent.store.get(array_path("j", "src", 0, st.id))
        assert mapped_file(got) is not None  # a view of the file, not a copy
        assert got.tobytes() == materialize(src, tensors, st).tobytes()
        assert agent.fetch("j", "src")[1] == {("p", 0): {"iteration": 3}}
        out = tmp_path / "x.npy"
        dst = create_mapped(str(out), list(got.shape), src.tensor_map[st.tensor].dtype)
        dst[...] = got
        del dst
        assert load_npy(out, "x", ExecutionError).tobytes() == got.tobytes()  # the file is the array
        with pytest.raises(ExecutionError, match=f"{out}.*exists"):  # never replaced
            create_mapped(str(out), [2], "float32")
        assert load_npy(out, "x", ExecutionError).tobytes() == got.tobytes()
        empty = create_mapped(str(tmp_path / "e.npy"), [0, 3], "bfloat16")
        assert empty.shape == (0, 3) and load_npy(tmp_path / "e.npy", "e", ExecutionError).shape == (0, 3)
    finally:
        agent.stop()


@pytest.mark.timeout(60)
def test_agent_refuses_a_src_file_that_is_not_its_row(case, tmp_path):
    src, _, _, a = case
    rows = _rows(src, a)
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 3), np.float32))
    victim = src.subtensors[2].id
    rows[(victim, 0)][0] = str(bad)
    agent = Agent("h0")
    try:
        with pytest.raises(ExecutionError, match=f"{bad}: holds float32\\[3, 3\\].*sub-tensor {victim!r}"):
            agent.load_files("j", "src", rows)
        rows[(victim, 0)][0] = str(tmp_path / "missing.npy")
        with pytest.raises(ExecutionError, match="missing.npy"):
            agent.load_files("j", "src", rows)
    finally:
        agent.stop()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_two_workers_each_write_their_share_from_the_src_files(case, tmp_path, monkeypatch):
    _, dst, tensors, a = case
    log = tmp_path / "written.log"  # appended to by the worker processes (forked: they run the patched writer)
    real = directory.write_file

    def logged(path, write, key, *flags):
        real(path, write, key, *flags)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {os.stat(path).st_size} {path}\n")

    monkeypatch.setattr(directory, "write_file", logged)
    reshard(a, dst, tmp_path / "b", workers=2, **FAST)
    _, arrays, values = read_checkpoint(tmp_path / "b")
    assert all(arrays[st.id].tobytes() == materialize(dst, tensors, st).tobytes() for st in dst.subtensors)
    assert all(values[p.id]["iteration"] == 7 for p in dst.partitions)
    rows = [line.split() for line in log.read_text().splitlines()]
    npy = [r for r in rows if r[2].endswith(".npy")]
    assert len(npy) == len({r[2] for r in npy}) == len(dst.subtensors)  # every dst file once
    assert all(".b.tmp-" in r[2] for r in npy)  # into OUT's temporary
    per_pid: dict[str, int] = {}
    for pid, size, _ in npy:
        per_pid[pid] = per_pid.get(pid, 0) + int(size)
    assert len(per_pid) == 2 and str(os.getpid()) not in per_pid  # two worker processes, not this one
    assert max(per_pid.values()) < 1.2 * min(per_pid.values())  # shared out by bytes
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("tenplex-worker-")]


def _kill(name: str, when: str):
    def on_round(done: int, total: int) -> None:
        if done == (total if when == "last" else total // 2):  # "last": every file or round done, nothing committed
            for p in multiprocessing.active_children():
                if p.name == name:
                    p.kill()
                    p.join(5)

    return on_round


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("central,name,when", [(False, "tenplex-worker-w1", "half"), (False, "tenplex-worker-w1", "last"),
                                               pytest.param(True, "tenplex-agent-w1", "last", marks=UCX)])  # fmt: skip
def test_a_worker_that_dies_leaves_no_out_and_the_src_intact(case, tmp_path, central, name, when):
    _, dst, _, a = case
    before = _files(a)
    with pytest.raises(ExecutionError, match=r"host 'w1'.*(agent|worker) process died"):
        reshard(a, dst, tmp_path / "out", workers=2, central=central, on_round=_kill(name, when), **FAST)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert _files(a) == before
    assert not [p for p in multiprocessing.active_children() if p.name.startswith(("tenplex-agent-", "tenplex-worker-"))]


# --workers 2 forks its agents (no imports) and moves bytes between them without UCX (cma); a
# tenplex directory needs only `formats.detect`, not the other formats' conversions
FORMATS = ["tenplex.frameworks.formats.conversion", "tenplex.frameworks.formats.findings"]
LIGHT = {1: ["networkx", "scipy", "argparse", "importlib.metadata", "torch", "rich", "aiohttp", "ucxx", *FORMATS],
         2: ["scipy", "ucxx", "torch", *FORMATS]}  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", [1, 2])
def test_the_reshard_command_imports_only_what_it_needs(case, tmp_path, workers):
    _, dst, tensors, a = case
    (tmp_path / "dst.json").write_text(dumps(dst))
    argv = ["reshard", str(a), "--to", str(tmp_path / "dst.json"), "--out", str(tmp_path / "b"), "--workers", str(workers)]  # fmt: skip
    script = (f"import sys; from tenplex.cli.app import cli; cli.main({argv!r}, standalone_mode=False); "
              f"print([m for m in {LIGHT[workers]!r} if m in sys.modules])")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=80, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "resharded into" in done.stdout
    _, arrays, _ = read_checkpoint(tmp_path / "b")
    assert all(arrays[st.id].tobytes() == materialize(dst, tensors, st).tobytes() for st in dst.subtensors)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.tmp-")]