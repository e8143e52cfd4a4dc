"""RankFiles, the layout of the FUSE view without FUSE: names sort in reading order, parse back
exactly, name the same bytes in every view (independent of W), suffixes and `.npy` headers by
sample format, `.state.json`, and one test per error message."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tenplex.data import DataError, DatasetIndex, DataState, RankFiles
from tenplex.data.rank_files import npy_header, numpy_suffix
from tests.data.helpers import raw_index


def build(n: int = 30, g: int = 12, world: int = 3, rank: int = 1, steps: int | None = 2, **kw) -> RankFiles:
    index = raw_index(n)
    return RankFiles.build(index, DataState.start(index, 4, g), world, rank, steps, **kw)


def test_names_sort_in_reading_order_and_parse_back():
    files = build(n=1500, g=1200, world=1, rank=0, steps=1)
    names = [files.name(k, i, ".bin") for k, i in enumerate(files.share(0).tolist())]
    assert names == sorted(names) and names[0].startswith("0000-") and len(names[0]) == len("0000-0000.bin")
    assert [files.parse(0, n) for n in names[:3]] == [(k, int(files.share(0)[k]), ".bin") for k in range(3)]
    assert files.steps == range(0, 1) and files.step_name(7) == "step-000007"


@pytest.mark.parametrize(
    "name",
    ["000-7.bin", "001-9.bin", "000-1.bin", "000-9.bin", "0-5.bin", "001-00.bin", "x-1.bin", "004-1.bin", "000-1"],
)
def test_parse_rejects_names_this_view_does_not_have(name):
    files = build(n=10, g=4, world=1, rank=0)
    names = {files.name(k, i, ".bin") for k, i in enumerate(files.share(0).tolist())}
    assert (files.parse(0, name) is not None) == (name in names)


def test_step_directories_outside_the_view_do_not_exist():
    files = build(steps=2)
    assert [files.parse_step(n) for n in ("step-000000", "step-000001", "step-000002", "step-0", "step-0000001")] == [
        0,
        1,
        None,
        None,
        None,
    ]


def test_a_path_names_the_same_sample_for_every_w():
    """Content addressing: a (step, position, id) name means one sample, whatever the view."""
    index = raw_index(48)
    state = DataState.start(index, 2, 12)
    seen: dict[str, int] = {}
    for world in (1, 2, 3, 4, 6, 12):
        for rank in range(world):
            files = RankFiles.build(index, state, world, rank, 3)
            for step in files.steps:
                for k, i in enumerate(files.share(step).tolist()):
                    rel = f"{files.step_name(step)}/{files.name(k, i, '.bin')}"
                    assert seen.setdefault(rel, i) == i


def test_suffixes_and_the_megatron_header():
    assert numpy_suffix("x/a.npz", b"\x93N") == ".npz" and numpy_suffix("a.stream", b"PK") == ".npz"
    assert numpy_suffix("a.stream", b"\x93N") == ".npy" and build().suffix(0) == ".bin" and not build().needs_head(0)
    npz = DatasetIndex.from_files("numpy", "", [("a.npz", 9, [0], [9]), ("b.stream", 9, [0], [9])])
    files = RankFiles.build(npz, DataState.start(npz, 0, 1), 1, 0, 1)
    assert [files.needs_head(0), files.needs_head(1), files.suffix(0), files.suffix(1, b"PK")] == [False, True, ".npz", ".npz"]
    tokens = np.arange(5, dtype=np.int32)
    index = DatasetIndex.from_files("megatron", "", [("t.bin", 20, [0, 8], [8, 12])], "int32")
    files = RankFiles.build(index, DataState.start(index, 0, 2), 1, 0, 1)
    sample = files.sample_file(0, 0)
    data = tokens.tobytes()[index.offset[sample.sample_id] : index.offset[sample.sample_id] + sample.length]
    assert files.suffix(sample.sample_id) == ".npy" and sample.size == len(sample.header) + sample.length
    np.testing.assert_array_equal(np.load(io.BytesIO(sample.header + data)), np.frombuffer(data, np.int32))
    assert npy_header("uint16", 3).startswith(b"\x93NUMPY") and len(npy_header("uint16", 3)) % 64 == 0


def test_state_doc_names_the_view():
    files = build(g=6, world=2, rank=1, steps=3, generation=5)
    doc = files.state_doc()
    assert (doc["generation"], doc["step"], doc["stop"], doc["world"], doc["rank"], doc["epoch"]) == (5, 0, 3, 2, 1, 0)
    assert doc["state"] == files.state.to_json() and files.state_bytes().endswith(b"}\n")


def test_steps_none_shows_the_rest_of_the_epoch():
    index = raw_index(30)
    state = DataState.start(index, 1, 4)
    files = RankFiles.build(index, state.commit(state.order_for(index), 9), 2, 0)
    assert files.steps == range(9, 14)  # 30 // 4 = 7 steps per epoch: step 9 is epoch 1's third


def test_errors_name_the_field():
    index = raw_index(10)
    state = DataState.start(index, 1, 2)
    files = RankFiles.build(index, state, 1, 0, 2)
    with pytest.raises(DataError, match=r"^steps: expected an integer >= 0, got -1$"):
        RankFiles.build(index, state, 1, 0, -1)
    with pytest.raises(DataError, match=r"^stop: expected a step >= 0, got -2$"):
        RankFiles(index, state, files.view, -2)
    with pytest.raises(DataError, match=r"^generation: expected an integer >= 0, got -1$"):
        RankFiles(index, state, files.view, 2, -1)
    later = state.commit(state.order_for(index), 3)
    with pytest.raises(DataError, match=r"^view: starts at step 0, but the state's next step is 3$"):
        RankFiles(index, later, files.view, 4)
    with pytest.raises(DataError, match=r"^rank: 1 is not in 0..0$"):
        RankFiles.build(index, state, 1, 1)
