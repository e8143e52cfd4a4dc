"""The ranges file (`tenplex.data.ranges_file`): its bytes are the documented layout, `parse`
gives back what `build` wrote for any steps and rows, every malformed file is one DataError
naming the file, and `RangesReader` reads each step's samples from the sources."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.data import DataError, DatasetIndex, DataState, RankFiles, SampleReader, ranges_file
from tests.data.helpers import write_raw_samples
from tests.data.strategies import jobs


@given(st.lists(st.integers(0, 5), max_size=6), st.integers(1, 4), st.data())
def test_parse_gives_back_what_build_wrote(counts, sources, data):
    n = sum(counts)
    rows = np.array(data.draw(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, sources - 1),
                                                 st.integers(0, 2**40), st.integers(0, 2**20)), min_size=n, max_size=n)),
                    np.int64).reshape(n, 4)  # fmt: skip
    blob = ranges_file.build(7, 4, 3, 11, sources, np.array(counts, np.int64), rows)
    assert len(blob) == ranges_file.size(len(counts), n) == 80 + 8 * (len(counts) + 1) + 32 * n
    assert blob[:8] == b"TPLXRNGS" and np.frombuffer(blob, "<u8", 9, 8).tolist() == [1, 7, 4, 3, 11, len(counts), n, sources, 4]
    got = ranges_file.parse(blob)
    assert (got.generation, got.world, got.rank, got.first, got.sources) == (7, 4, 3, 11, sources)
    assert got.steps == range(11, 11 + len(counts))
    at = 0
    for s, count in enumerate(counts):
        assert got.step_rows(11 + s).tolist() == rows[at : at + count].tolist()
        at += count


def _blob() -> bytes:
    return ranges_file.build(0, 2, 0, 0, 2, np.array([2, 1]), np.array([[5, 0, 0, 3], [6, 1, 3, 3], [7, 0, 6, 1]]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [(lambda b: b[:40], "not a tenplex ranges file"), (lambda b: b"TPLXSTEP" + b[8:], "not a tenplex ranges file"),
     (lambda b: b[:8] + (2).to_bytes(8, "little") + b[16:], "version 2"),
     (lambda b: b[:-8], "bytes, but 2 steps of 3 rows"), (lambda b: b + bytes(8), "bytes, but 2 steps of 3 rows"),
     (lambda b: b[:88] + (4).to_bytes(8, "little") + b[96:], "row starts do not split 3 rows"),
     (lambda b: b[:-24] + (2).to_bytes(8, "little") + b[-16:], "names source 2, but there are 2")],
)  # fmt: skip
def test_a_malformed_file_is_one_error_naming_it(edit, message):
    with pytest.raises(DataError, match=message) as e:
        ranges_file.parse(edit(_blob()), "DIR/ranges.bin")
    assert str(e.value).startswith("DIR/ranges.bin: ")


def test_a_step_outside_the_table_is_an_error():
    with pytest.raises(DataError, match="step 2: not in this view's steps 0..1"):
        ranges_file.parse(_blob()).step_rows(2)


def test_the_reader_reads_each_step_from_the_sources_and_refreshes_once(tmp_path):
    """A plain directory laid out as a view (no mount): every step's samples are the reader's,
    views of one kept buffer; a step beyond the table reads the table again, then fails."""
    index = write_raw_samples(tmp_path / "s.bin", 30)
    files = RankFiles.build(index, DataState.start(index, 5, 6), 3, 2, 4)
    (tmp_path / "view" / "sources").mkdir(parents=True)
    (tmp_path / "view" / "ranges.bin").write_bytes(files.ranges_bytes())
    (tmp_path / "view" / "sources" / "000000").symlink_to(tmp_path / "s.bin")
    reader = SampleReader(index, decode=False)
    with ranges_file.RangesReader(tmp_path / "view") as r:
        for step in files.steps:
            batch = r.read(step)
            assert (batch.step, batch.world, batch.rank, batch.ids) == (step, 3, 2, files.ids(step))
            assert [bytes(x) for x in batch.samples] == [reader.read(i) for i in files.ids(step)]
        later = RankFiles.build(index, DataState.start(index, 5, 6), 3, 2, 5, generation=1)
        (tmp_path / "view" / "ranges.bin").write_bytes(later.ranges_bytes())
        assert r.read(4).ids == later.ids(4) and r.ranges.generation == 1
        with pytest.raises(DataError, match="step 5: not in this view's steps 0..4"):
            r.read(5)


def test_the_reader_keeps_a_bounded_number_of_sources_open(tmp_path, monkeypatch):
    """A dataset of a file per sample: the reader closes the source it opened first beyond
    `OPEN_SOURCES` and still reads every sample right."""
    names = [f"s{i}.bin" for i in range(9)]
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(bytes([i]) * (i + 1))
    index = DatasetIndex.from_files("raw", str(tmp_path), [(n, i + 1, [0], [i + 1]) for i, n in enumerate(names)])
    files = RankFiles.build(index, DataState.start(index, 2, 3), 1, 0, 3)
    (tmp_path / "view" / "sources").mkdir(parents=True)
    (tmp_path / "view" / "ranges.bin").write_bytes(files.ranges_bytes())
    for i, name in enumerate(names):
        (tmp_path / "view" / "sources" / ranges_file.source_name(i)).symlink_to(tmp_path / name)
    monkeypatch.setattr(ranges_file, "OPEN_SOURCES", 2)
    with ranges_file.RangesReader(tmp_path / "view") as r:
        for step in files.steps:
            assert [bytes(x) for x in r.read(step).samples] == [bytes([i]) * (i + 1) for i in files.ids(step)]
            assert len(r._fds) <= 2 and all(os.fstat(fd) for fd in r._fds.values())


@settings(max_examples=60, deadline=None)
@given(jobs(max_n=80), st.data())
def test_a_views_ranges_are_its_shares_and_their_index_entries(job, data):
    """For any job, W (uneven too), rank and number of steps, `ranges.bin` parses to the rank's
    share of every step in reading order, each row the sample's (file, offset, length) of the
    index, in files spread over several sources."""
    bounds = np.linspace(0, job.n, data.draw(st.integers(1, min(4, job.n))) + 1).astype(int).tolist()
    index = DatasetIndex.from_files("raw", "", [(f"f{k}.bin", 4 * (b - a), np.arange(b - a) * 4, np.full(b - a, 4))
                                                for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))])  # fmt: skip
    uneven = data.draw(st.booleans())
    world = data.draw(st.integers(1, 8) if uneven else st.sampled_from(job.divisors()))
    rank = data.draw(st.integers(0, world - 1))
    steps = data.draw(st.none() | st.integers(0, job.steps_per_epoch + 2))
    state = DataState.start(index, job.seed, job.g, tail_policy=job.tail)
    files = RankFiles.build(index, state, world, rank, steps, uneven, generation=data.draw(st.integers(0, 9)))
    got = ranges_file.parse(files.ranges_bytes())
    assert (got.generation, got.world, got.rank, got.steps, got.sources) == (
        files.generation, world, rank, files.steps, len(index.files))  # fmt: skip
    for step in files.steps:
        ids, sources, offsets, lengths = got.step_rows(step).T.tolist()
        assert ids == files.ids(step)
        assert [index.sample(i) for i in ids] == list(zip(sources, offsets, lengths))
