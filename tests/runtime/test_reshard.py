"""Checkpoint directories and `reshard`: format round trip, oracle equality with 1 and 2
workers (and central), failures leave no OUT_DIR, the CLI end to end, and A -> B -> A.

Every test has a hard timeout; multi-worker runs use `Runtime.local` as a context manager
(agents always stopped) with short UCX and round timeouts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.runtime import reshard as reshard_module
from tenplex.runtime.arrays import arange_tensors, materialize
from tenplex.runtime.checkpoint import directory as rs
from tenplex.runtime.checkpoint.directory import CheckpointError, read_checkpoint, write_checkpoint
from tenplex.runtime.reshard import reshard
from tenplex.runtime.transport.ucx import ucx_available

SRC, DST = "gpt-tiny:tp2,pp2@1x4", "gpt-tiny:tp4,pp1@1x4"
UCX = pytest.mark.skipif(ucx_available() is not None, reason=f"ucxx cannot be imported: {ucx_available()}")
FAST = {"timeout": 20.0, "round_timeout": 60.0}


def _values(ptc: PTC) -> dict[str, dict]:
    return {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    src, dst = ptc_from_spec(SRC), ptc_from_spec(DST)
    tensors = arange_tensors(src)
    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, _values(src), root / "a")
    return src, dst, tensors, root / "a"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_oracle(out: Path, dst: PTC, tensors: dict) -> None:
    ptc, arrays, values = read_checkpoint(out)
    assert ptc == dst
    for st in dst.subtensors:
        assert arrays[st.id].tobytes() == materialize(dst, tensors, st).tobytes(), st.id
    for p in dst.partitions:
        assert values[p.id]["iteration"] == 7  # replicated: copied from src
        assert values[p.id]["rng"] == p.value_map["rng"].value  # per-rank: carried by dst


def _no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.tmp-")]


@pytest.mark.timeout(60)
def test_format_round_trip(case, tmp_path):
    src, _, tensors, a = case
    ptc, arrays, values = read_checkpoint(a)
    assert ptc == src and values == _values(src)
    st = next(s for s in src.subtensors if src.tensor_map[s.tensor].dtype == "bfloat16")
    on_disk = np.load(a / st.id.split("/")[0] / f"{st.path}.npy")  # the header names bfloat16
    assert on_disk.dtype.name == "bfloat16" and arrays[st.id].dtype.name == "bfloat16"
    for s in src.subtensors:
        assert arrays[s.id].tobytes() == materialize(src, tensors, s).tobytes()
    write_checkpoint(ptc, arrays, values, tmp_path / "copy")
    assert _files(tmp_path / "copy") == _files(a)


@pytest.mark.timeout(60)
def test_reshard_one_worker_matches_oracle(case, tmp_path):
    _, dst, tensors, a = case
    result = reshard(a, dst, tmp_path / "b", workers=1)
    _assert_oracle(tmp_path / "b", dst, tensors)
    assert result.verified and result.network_bytes == 0 and "1 worker" in result.summary()


@UCX
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("central", [False, True], ids=["direct", "central"])
def test_reshard_two_workers_matches_oracle(case, tmp_path, central):
    _, dst, tensors, a = case
    rounds: list[tuple[int, int]] = []
    result = reshard(a, dst, tmp_path / "b", workers=2, central=central, on_round=lambda d, t: rounds.append((d, t)), **FAST)
    _assert_oracle(tmp_path / "b", dst, tensors)
    assert len(result.plans) == (2 if central else 1) and ("gathered on w0" in result.summary()) == central
    # central: agents, whose progress is the plans' rounds; direct: worker processes that each
    # write their files from the src files (nothing moves between them), progress per file
    assert (result.network_bytes > 0) == central
    total = sum(p.stats.rounds for p in result.plans) if central else len(dst.subtensors)
    assert rounds == [(k, total) for k in range(1, total + 1)]


@pytest.mark.timeout(60)
def test_round_trip_restores_original_bytes(case, tmp_path):
    src, dst, _, a = case
    reshard(a, dst, tmp_path / "b")
    reshard(tmp_path / "b", src, tmp_path / "a2")
    assert _files(tmp_path / "a2") == _files(a)


def _copy(a: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(a, to)
    return to


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["corrupt", "shape", "missing", "values"])
def test_bad_src_names_the_file_and_leaves_no_out(case, tmp_path, damage):
    src, dst, _, a = case
    bad = _copy(a, tmp_path / "bad")
    st = src.subtensors[3]
    victim = bad / src.partition_of[st.id] / f"{st.path}.npy"
    if damage == "corrupt":
        victim.write_bytes(victim.read_bytes()[:40])
    elif damage == "shape":
        np.save(victim, np.zeros((3, 3), dtype=np.float32))
    elif damage == "missing":
        victim.unlink()
    else:
        victim = bad / src.partitions[0].id / "values.json"
        victim.write_text(json.dumps({"iteration": 1}))
    with pytest.raises(CheckpointError, match=re.escape(str(victim))):
        reshard(bad, dst, tmp_path / "out")
    _no_leftovers(tmp_path, "out")


@pytest.mark.timeout(60)
def test_failure_while_writing_leaves_no_out(case, tmp_path, monkeypatch):
    _, dst, _, a = case
    real = rs.write_checkpoint

    def half(ptc, arrays, values, out, *tree):  # writes the arrays, then dies
        real(ptc, arrays, values, out, *tree)
        raise OSError("disk full")

    monkeypatch.setattr(rs, "write_checkpoint", half)
    monkeypatch.setattr(reshard_module, "write_checkpoint", half)  # the peer-to-peer path writes into its own temporary
    with pytest.raises(OSError, match="disk full"):
        reshard(a, dst, tmp_path / "out")
    _no_leftovers(tmp_path, "out")


@pytest.mark.timeout(60)
def test_existing_out_is_refused(case, tmp_path):
    _, dst, _, a = case
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(CheckpointError, match="already exists"):
        reshard(a, dst, tmp_path / "out")
    assert _files(tmp_path / "out") == {"keep": b"x"}


@pytest.mark.timeout(60)
def test_shared_path_in_a_partition_is_rejected(case, tmp_path):
    src, _, tensors, _ = case
    part = src.partitions[0]
    first, second = (src.subtensor_map[s] for s in part.subtensors[:2])
    subs = [
        s if s.id != second.id else type(s)(s.id, s.tensor, first.path, s.shape, s.pieces, s.fill)
        for s in src.subtensors
    ]
    dup = PTC(src.tensors, subs, src.partitions, src.allocation, src.topology)
    with pytest.raises(CheckpointError, match="share path"):
        write_checkpoint(dup, {s.id: materialize(dup, tensors, s) for s in subs}, _values(dup), tmp_path / "d")


@pytest.mark.timeout(60)
def test_cli_reshard_end_to_end(case, tmp_path):
    _, dst, tensors, a = case
    runner = CliRunner()
    res = runner.invoke(cli, ["reshard", str(a), "--to", DST, "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert "moved between devices" in res.output and "verified" in res.output
    _assert_oracle(tmp_path / "b", dst, tensors)
    res = runner.invoke(cli, ["reshard", str(a), "--to", DST, "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "already exists" in res.output


@pytest.mark.timeout(60)
def test_console_entry_flushes_its_result_before_it_skips_the_teardown(case, tmp_path):
    """`python -m tenplex.cli reshard` ends with os._exit after success (`common.skip_teardown`):
    the JSON on a pipe is whole and OUT complete; a stdout that cannot be written still fails."""
    _, dst, tensors, a = case
    argv = [sys.executable, "-m", "tenplex.cli", "reshard", str(a), "--to", DST, "--json"]
    done = subprocess.run([*argv, "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "tenplex.reshard/1"
    _assert_oracle(tmp_path / "b", dst, tensors)
    with open("/dev/full", "w") as full:
        failed = subprocess.run([*argv, "--out", str(tmp_path / "c")], stdout=full, stderr=subprocess.PIPE, text=True, timeout=50)
    assert failed.returncode == 2 and "No space left on device" in failed.stderr


@pytest.mark.timeout(60)
def test_not_a_checkpoint(tmp_path):
    with pytest.raises(TenplexError, match="ptc.json"):
        reshard(tmp_path, ptc_from_spec(DST), tmp_path / "out")
