"""`tenplex dataset index|order|inspect`: outputs, resume from a state, one-line errors with
exit code 2, and a log that is byte-identical across processes (P4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tenplex.data import DatasetIndex, DataState
from tests.data.strategies import Job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def index_file(tmp_path, tenplex) -> str:
    (tmp_path / "ds").mkdir()
    for i in range(10):
        np.save(tmp_path / "ds" / f"{i:02d}.npy", np.full(i + 1, i))
    code, out, err = tenplex("dataset", "index", str(tmp_path / "ds"), "-o", str(tmp_path / "ds.npz"))
    assert (
        code == 0
        and out == ""
        and err.startswith(f"tenplex: wrote {tmp_path}/ds.npz (10 samples in 10 files, fingerprint ")
    )
    return str(tmp_path / "ds.npz")


def lines(out: str) -> list[tuple]:
    return [(d["epoch"], d["step"], d["rank"], d["samples"]) for d in map(json.loads, out.splitlines())]


def test_order_prints_what_each_rank_reads(index_file, tenplex):
    code, out, err = tenplex(
        "dataset", "order", index_file, "--global-batch", "4", "--seed", "7", "--schedule", "0:2,3:1", "--epochs", "2"
    )
    assert code == 0, err
    assert lines(out) == Job(10, 4, 7, "drop").oracle([(0, 2), (3, 1)], 4)
    assert json.loads(out.splitlines()[0]).keys() == {"epoch", "step", "rank", "samples"}


def test_order_with_partial_tail_and_uneven_ranks(index_file, tenplex):
    args = ("dataset", "order", index_file, "-G", "4", "--seed", "1", "--schedule", "0:3,2:4", "--tail", "partial")
    code, out, err = tenplex(*args)
    assert (
        code == 2
        and err
        == "tenplex: error: schedule: step 0: world: 3 ranks do not divide global batch 4 (divisors: 1, 2, 4); pass uneven=True (CLI: --uneven) to allow uneven splits\n"
    )
    code, out, _ = tenplex(*args, "--uneven")
    assert code == 0 and lines(out) == Job(10, 4, 1, "partial").oracle([(0, 3), (2, 4)], 3)


def test_order_resumes_from_a_state(index_file, tenplex, tmp_path):
    index = DatasetIndex.load(index_file)
    state = DataState.start(index, 7, 2)
    state.commit(state.order_for(index), 7).save(tmp_path / "state.json")
    code, out, err = tenplex(
        "dataset",
        "order",
        index_file,
        "-G",
        "2",
        "--seed",
        "7",
        "--schedule",
        "0:2",
        "--state",
        str(tmp_path / "state.json"),
    )
    assert code == 0, err
    assert lines(out) == Job(10, 2, 7, "drop").oracle([(0, 2)], 10, start=7)
    code, _, err = tenplex(
        "dataset",
        "order",
        index_file,
        "-G",
        "2",
        "--seed",
        "8",
        "--schedule",
        "0:2",
        "--state",
        str(tmp_path / "state.json"),
    )
    assert code == 2 and err == f"tenplex: error: {tmp_path}/state.json: seed: the state has 7 but the job has 8\n"


def test_inspect(index_file, tenplex):
    code, out, _ = tenplex("dataset", "inspect", index_file)
    index = DatasetIndex.load(index_file)
    assert code == 0
    assert (
        "sample format: numpy\n" in out
        and "files:         10 (" in out
        and f"fingerprint:   {index.fingerprint}\n" in out
    )
    assert "samples:       10 (" in out and "  09.npy" in out


def test_inspect_json_has_the_facts_of_the_text(index_file, tenplex):
    """Issue 13 item 14: `dataset inspect --json`, one document on stdout."""
    code, out, err = tenplex("dataset", "inspect", index_file, "--json")
    assert code == 0 and err == "", err
    doc, index = json.loads(out), DatasetIndex.load(index_file)
    assert doc["format"] == "tenplex.dataset-inspect/1" and doc["index"] == index_file
    assert (doc["sample_format"], doc["samples"], doc["fingerprint"]) == ("numpy", 10, index.fingerprint)
    assert [f["name"] for f in doc["files"]] == [f"{i:02d}.npy" for i in range(10)]
    assert [f["samples"] for f in doc["files"]] == [1] * 10 and doc["sample_sizes"]["min"] <= doc["sample_sizes"]["max"]
    assert doc["file_bytes"] == sum(f["bytes"] for f in doc["files"])


def test_quiet_index_writes_nothing_on_stderr(tmp_path, tenplex):
    (tmp_path / "ds").mkdir()
    np.save(tmp_path / "ds" / "a.npy", np.ones(3))
    code, out, err = tenplex("-q", "dataset", "index", str(tmp_path / "ds"), "-o", str(tmp_path / "q.npz"))
    assert (code, out, err) == (0, "", "") and (tmp_path / "q.npz").is_file()


ERRORS = [
    pytest.param(
        ("order", "{index}", "-G", "11", "--seed", "0", "--schedule", "0:1"),
        "global_batch: 11 exceeds the 10 samples of the index, so tail policy 'drop' leaves no step in an epoch",
        id="g_above_n",
    ),
    pytest.param(
        ("order", "{index}", "-G", "2", "--seed", "0", "--schedule", "2:1"),
        "schedule: must start at step 0, got 2:1",
        id="schedule_start",
    ),
    pytest.param(
        ("order", "{tmp}/none.npz", "-G", "2", "--seed", "0", "--schedule", "0:1"),
        "{tmp}/none.npz: cannot read a dataset index",
        id="missing_index",
    ),
    pytest.param(
        ("index", "{tmp}/x.csv", "-o", "{tmp}/i.npz"),
        "{tmp}/x.csv: cannot tell the dataset format from the extension",
        id="unknown_format",
    ),
    pytest.param(
        ("index", "{tmp}/x.csv", "--format", "tfrecord", "-o", "{tmp}/i.npz"),
        "{tmp}/x.csv: truncated: record 0's header needs 12 bytes at offset 0, only 5 left",
        id="forced_format",
    ),
    pytest.param(("inspect", "{tmp}/x.csv"), "{tmp}/x.csv: cannot read a dataset index", id="inspect_non_index"),
]


@pytest.mark.parametrize(("args", "message"), ERRORS)
def test_errors_are_one_line_and_exit_2(index_file, tenplex, tmp_path, args, message):
    (tmp_path / "x.csv").write_text("1,2,3")
    fill = {"index": index_file, "tmp": str(tmp_path)}
    code, out, err = tenplex("dataset", *(a.format(**fill) for a in args))
    assert code == 2 and out == ""
    assert err.startswith("tenplex: error: " + message.format(**fill)) and err.count("\n") == 1, err
    assert not (tmp_path / "i.npz").exists()


def test_p4_order_log_is_identical_across_processes(index_file, tenplex):
    args = ["dataset", "order", index_file, "-G", "4", "--seed", "99", "--schedule", "0:4,1:2,2:1", "--epochs", "3"]
    outputs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        run = subprocess.run(
            [sys.executable, "-m", "tenplex.cli", *args], env=env, capture_output=True, text=True, cwd=ROOT, check=True
        )
        outputs.add(run.stdout)
    assert outputs == {tenplex(*args)[1]}


def test_help_lists_the_dataset_commands(tenplex):
    code, out, _ = tenplex("dataset", "--help")
    assert code == 0 and all(c in out for c in ("index", "order", "inspect"))
