"""Checkpoint directories whose partitions have no values (issue 13 item 12): the format is
`ptc.json` + `<partition>/<path>.npy`, and `values.json` exists only for a partition with values.
Written without it, read without it (a hand-made directory too), and one test per message of
the values file that is there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tenplex.ir.serialize import dumps, ptc_from_json
from tenplex.runtime.checkpoint.directory import CheckpointError, read_checkpoint, write_checkpoint
from tenplex.runtime.checkpoint.store_dir import open_dir, write_back

W = np.arange(8, dtype=np.float32).reshape(2, 4)


def _ptc(values: dict[str, dict]):
    """Two partitions of a [2, 4] tensor, one row each; `values`: partition id -> values JSON."""
    doc = {
        "format": "tenplex.ptc/1",
        "devices": [{"id": 0, "host": "h0"}, {"id": 1, "host": "h0"}],
        "tensors": {"w": {"shape": [2, 4], "dtype": "float32"}},
        "subtensors": {f"w/{r}": {"tensor": "w", "path": "model/w", "box": [[r, r + 1], [0, 4]]} for r in (0, 1)},
        "partitions": {f"p{r}": {"subtensors": [f"w/{r}"], "values": values.get(f"p{r}", {})} for r in (0, 1)},
        "allocation": {"p0": [0], "p1": [1]},
    }
    return ptc_from_json(doc)


def _arrays() -> dict[str, np.ndarray]:
    return {"w/0": W[:1].copy(), "w/1": W[1:].copy()}


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_a_partition_without_values_gets_no_values_file(tmp_path):
    ptc = _ptc({"p0": {"iteration": {"value": 7}}})
    write_checkpoint(ptc, _arrays(), {"p0": {"iteration": 7}}, tmp_path / "ck")
    assert _files(tmp_path / "ck") == ["p0/model/w.npy", "p0/values.json", "p1/model/w.npy", "ptc.json"]
    got_ptc, arrays, values = read_checkpoint(tmp_path / "ck")
    assert got_ptc == ptc and values == {"p0": {"iteration": 7}, "p1": {}}
    assert np.array_equal(arrays["w/1"], W[1:])


def test_a_hand_made_directory_of_ptc_json_and_npy_files_reads(tmp_path):
    """The documented format, written without tenplex's writer: no values.json anywhere."""
    root = tmp_path / "ck"
    for r in (0, 1):
        (root / f"p{r}/model").mkdir(parents=True)
        np.save(root / f"p{r}/model/w.npy", W[r : r + 1])
    (root / "ptc.json").write_text(dumps(_ptc({})))
    _, arrays, values = read_checkpoint(root)
    assert values == {"p0": {}, "p1": {}} and np.array_equal(arrays["w/0"], W[:1])


def test_a_store_of_a_directory_without_values_writes_back_without_values(tmp_path):
    write_checkpoint(_ptc({}), _arrays(), {}, tmp_path / "ck")
    sd = open_dir(tmp_path / "ck")
    assert sorted(sd.store.walk()) == ["/p0/model/w", "/p1/model/w"]
    sd.store.put("/p1/model/w", W[1:] + 1, replace=True)
    write_back(sd)
    assert _files(tmp_path / "ck") == ["p0/model/w.npy", "p1/model/w.npy", "ptc.json"]
    assert np.array_equal(read_checkpoint(tmp_path / "ck")[1]["w/1"], W[1:] + 1)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    "values, write, message",
    [
        ({"p0": {"iteration": {"value": 7}}}, None, r"p0/values\.json: cannot read the values of partition 'p0': No such file or directory"),
        ({}, lambda p: p.write_text('{"x": 1}'), r"p0/values\.json: values \['x'\], expected \[\]"),
        ({}, lambda p: p.write_text("[]"), r"p0/values\.json: values list, expected \[\]"),
        ({}, _fifo, r"p0/values\.json: is a fifo, not a regular file"),
        ({}, lambda p: p.write_text("{}"), None),
    ],
    ids=["needed-and-missing", "unexpected-values", "not-an-object", "fifo", "empty-object"],
)
def test_the_values_file_that_is_there_is_checked(tmp_path, values, write, message):
    ptc = _ptc(values)
    write_checkpoint(ptc, _arrays(), {"p0": {"iteration": 7}} if values else {}, tmp_path / "ck")
    path = tmp_path / "ck/p0/values.json"
    path.unlink(missing_ok=True)
    if write is not None:
        write(path)
    if message is None:
        assert read_checkpoint(tmp_path / "ck")[2] == {"p0": {}, "p1": {}}
        return
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(tmp_path / "ck")


def test_the_writer_still_requires_every_declared_value(tmp_path):
    with pytest.raises(CheckpointError, match=r"partition 'p0': values \[\], expected \['iteration'\]"):
        write_checkpoint(_ptc({"p0": {"iteration": {"value": 7}}}), _arrays(), {}, tmp_path / "ck")
    assert json.loads(dumps(_ptc({})))["partitions"]["p1"]["values"] == {}
