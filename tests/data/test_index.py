"""DatasetIndex: invariants with their messages, the pinned fingerprint, save/load (P9)."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.data import DataError, DatasetIndex, FileEntry
from tests.data.helpers import raw_index

FILES = (FileEntry("a.bin", 10), FileEntry("b.bin", 4))


def test_fingerprint_is_pinned():
    # The canonical form (sorted compact header JSON, newline, little-endian int64 arrays) must never change.
    head = b'{"dtype":null,"files":[["data.bin",12]],"index":"tenplex.data-index/1","sample_format":"raw","samples":3}'
    arrays = np.array([0, 0, 0, 0, 4, 8, 4, 4, 4], "<i8").tobytes()
    assert raw_index(3).fingerprint == hashlib.sha256(head + b"\n" + arrays).hexdigest()
    assert raw_index(3).fingerprint == "2d17b45e650a6053cf75688952b617d47503349c972d549c8335c58e776e3abb"
    assert raw_index(3, root="/elsewhere").fingerprint == raw_index(3).fingerprint
    assert raw_index(3) != raw_index(3, root="/elsewhere") and raw_index(3) == raw_index(3)


def test_ranges_and_accessors():
    index = DatasetIndex("raw", FILES, [0, 0, 1], [0, 6, 0], [6, 4, 4], root="/data")
    assert len(index) == 3 and index.sample(1) == (0, 6, 4) and index.total_bytes() == 14
    assert index.location(1) == "/data/b.bin"
    assert not index.offset.flags.writeable
    assert [a.tolist() for a in index.ranges([2, 0])] == [[1, 0], [0, 0], [4, 6]]
    with pytest.raises(DataError, match=re.escape("sample 3 is not in the index (0..2)")):
        index.ranges([0, 3])
    with pytest.raises(DataError, match=re.escape("sample -1 is not in the index (0..2)")):
        index.sample(-1)


BAD = [
    pytest.param(
        dict(file_id=[0, 1], offset=[0, 2], length=[10, 3]),
        "sample 1 of b.bin: range [2, 5) is not a non-empty range inside the file's 4 bytes",
        id="range_beyond_file",
    ),
    pytest.param(
        dict(file_id=[0], offset=[-1], length=[2]),
        "sample 0 of a.bin: range [-1, 1) is not a non-empty range",
        id="negative_offset",
    ),
    pytest.param(
        dict(file_id=[0], offset=[3], length=[0]),
        "sample 0 of a.bin: range [3, 3) is not a non-empty range",
        id="empty_range",
    ),
    pytest.param(
        dict(file_id=[2], offset=[0], length=[1]),
        "sample 0: file_id 2 is not in the file table (0..1)",
        id="unknown_file",
    ),
    pytest.param(
        dict(file_id=[0, 0], offset=[0], length=[1]), "file_id, offset and length have lengths 2, 1, 1", id="ragged"
    ),
    pytest.param(
        dict(file_id=[[0]], offset=[[0]], length=[[1]]),
        "file_id: expected a 1-D array, got shape (1, 1)",
        id="two_dimensional",
    ),
    pytest.param(
        dict(file_id=[0.5], offset=[0], length=[1]), "index arrays hold integers, got dtype float64", id="float_ids"
    ),
    pytest.param(
        dict(sample_format="csv"),
        "sample_format 'csv' is not one of ['numpy', 'megatron', 'tfrecord', 'raw']",
        id="format",
    ),
    pytest.param(
        dict(dtype="int32"),
        "dtype 'int32' given for sample_format 'raw' (only megatron has one)",
        id="dtype_not_megatron",
    ),
    pytest.param(
        dict(sample_format="megatron", dtype="complex64"), "dtype 'complex64' is not one of", id="megatron_dtype"
    ),
    pytest.param(
        dict(files=(FileEntry("a", 1), FileEntry("a", 2))),
        "file 'a' appears twice in the file table",
        id="duplicate_file",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD)
def test_invalid_indexes_name_file_and_sample(fields, message):
    args = {"sample_format": "raw", "files": FILES, "file_id": [0], "offset": [0], "length": [1], **fields}
    with pytest.raises(DataError, match="^" + re.escape(message)):
        DatasetIndex(**args)


@pytest.mark.parametrize(("name", "size"), [("/abs", 1), ("", 1), ("a\\b", 1), ("a", -1), ("a", True)])
def test_invalid_file_entries(name, size):
    with pytest.raises(DataError, match="file name|size"):
        FileEntry(name, size)


def test_save_load_round_trip(tmp_path):
    index = DatasetIndex("megatron", FILES, [1, 0], [2, 0], [2, 10], root=str(tmp_path), dtype="uint16")
    index.save(tmp_path / "index.npz")
    loaded = DatasetIndex.load(tmp_path / "index.npz")
    assert loaded == index and loaded.dtype == "uint16" and loaded.offset.tolist() == [2, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.npz"]


def test_relative_root_resolves_against_the_index_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(bytes(8))
    raw_index(2, name="x.bin", root="data").save(tmp_path / "i.npz")
    loaded = DatasetIndex.load(tmp_path / "i.npz")
    assert loaded.location(0) == str(tmp_path / "data" / "x.bin")
    loaded.check_files()
    (tmp_path / "data" / "x.bin").write_bytes(bytes(7))
    with pytest.raises(
        DataError, match=re.escape(f"{tmp_path}/data/x.bin: size 7 bytes on disk, but the index records 8")
    ):
        loaded.check_files()


def _tampered(tmp_path, change) -> str:
    raw_index(4).save(tmp_path / "i.npz")
    with np.load(tmp_path / "i.npz") as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    return str(tmp_path / "bad.npz")


def _meta(arrays: dict, **fields) -> None:
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(fields)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)


LOAD_ERRORS = [
    pytest.param(
        lambda a: a["offset"].__setitem__(1, 5), "fingerprint: stored", id="changed_offset_mismatched_fingerprint"
    ),
    pytest.param(
        lambda a: a["length"].__setitem__(3, 5),
        "sample 3 of data.bin: range [12, 17) is not a non-empty range inside the file's 16 bytes",
        id="range_beyond_file",
    ),
    pytest.param(lambda a: a.pop("length"), "not a dataset index: no array 'length'", id="missing_array"),
    pytest.param(
        lambda a: _meta(a, index="tenplex.data-index/2"),
        "index: expected 'tenplex.data-index/1', got 'tenplex.data-index/2'",
        id="version",
    ),
    pytest.param(lambda a: _meta(a, extra=1), "meta: expected the keys", id="unknown_key"),
    pytest.param(lambda a: a.update(meta=np.frombuffer(b"{", np.uint8)), "meta: not valid JSON", id="bad_json"),
]


@pytest.mark.parametrize(("change", "message"), LOAD_ERRORS)
def test_load_errors_name_the_file(tmp_path, change, message):
    path = _tampered(tmp_path, change)
    with pytest.raises(DataError, match="^" + re.escape(f"{path}: {message}")):
        DatasetIndex.load(path)


def test_load_non_index(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}/x.npz: cannot read a dataset index")):
        DatasetIndex.load(tmp_path / "x.npz")


@given(st.lists(st.lists(st.integers(1, 9), max_size=6), min_size=1, max_size=4), st.data())
def test_p9_index_from_files_keeps_every_range_inside(files, data):
    parts = []
    for k, lengths in enumerate(files):
        gap = data.draw(st.integers(0, 3))
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int) + gap if lengths else []
        parts.append((f"f{k}", sum(lengths) + gap + data.draw(st.integers(0, 2)), offsets, lengths))
    index = DatasetIndex.from_files("raw", "", parts)
    assert len(index) == sum(map(len, files))
    sizes = np.array([f.size for f in index.files])[index.file_id]
    assert ((index.offset >= 0) & (index.length >= 1) & (index.offset + index.length <= sizes)).all()
    assert DatasetIndex.from_files("raw", "/x", parts).fingerprint == index.fingerprint
