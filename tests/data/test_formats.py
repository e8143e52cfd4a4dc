"""Index builders on real files (P9): numpy files, concatenated .npz, Megatron .bin/.idx built
field by field, TFRecord; CRC-32C vectors; a table of bad inputs and their messages."""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import zipfile

import numpy as np
import pytest

from tenplex.data import DataError, SampleReader, build_index
from tenplex.data.formats.crc32c import crc32c, crc32c_python, masked_crc32c
from tenplex.data.formats.tfrecord import encode_record
from tests.data.helpers import megatron_idx, npy_bytes, npz_bytes

CRC_VECTORS = [  # RFC 3720 appendix B.4 and the common check value
    pytest.param(b"123456789", 0xE3069283, id="check_value"),
    pytest.param(bytes(32), 0x8A9136AA, id="32_zeros"),
    pytest.param(b"\xff" * 32, 0x62A8AB43, id="32_ones"),
    pytest.param(bytes(range(32)), 0x46DD794E, id="ascending"),
    pytest.param(b"", 0, id="empty"),
]


@pytest.mark.parametrize(("data", "expected"), CRC_VECTORS)
def test_crc32c_vectors(data, expected):
    assert crc32c_python(data) == expected == crc32c(data)


def test_masked_crc_and_record_framing():
    assert masked_crc32c(b"") == 0xA282EAD8  # rotate(0) + delta
    record = encode_record(b"hello")
    assert len(record) == 5 + 16 and struct.unpack_from("<Q", record)[0] == 5
    assert struct.unpack_from("<I", record, 8)[0] == masked_crc32c(struct.pack("<Q", 5))
    assert record[12:17] == b"hello" and struct.unpack_from("<I", record, 17)[0] == masked_crc32c(b"hello")


def _sample_bytes(index, i: int) -> bytes:
    file_id, offset, length = index.sample(i)
    with open(index.location(file_id), "rb") as f:
        return f.read()[offset : offset + length]


def test_numpy_directory(tmp_path):
    arrays = [np.arange(i + 1) * 1.5 for i in range(4)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"s{i}.npy", a)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pair.npz").write_bytes(npz_bytes(x=np.ones(2)) + npz_bytes(y=np.zeros((2, 2))))
    (tmp_path / "notes.txt").write_text("ignored")
    index = build_index([str(tmp_path)])
    assert index.root == str(tmp_path) and [f.name for f in index.files] == [
        "s0.npy",
        "s1.npy",
        "s2.npy",
        "s3.npy",
        "sub/pair.npz",
    ]
    assert len(index) == 6 and index.file_id.tolist() == [0, 1, 2, 3, 4, 4]
    reader = SampleReader(index)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(reader[i], a)
    assert list(reader[4]) == ["x"] and reader[5]["y"].shape == (2, 2)


def test_concatenated_npz_stream(tmp_path):
    parts = [npz_bytes(x=np.arange(k), y=np.full((k, 2), k)) for k in range(5)]
    buf = io.BytesIO()
    np.savez_compressed(buf, z=np.arange(50))
    parts += [buf.getvalue(), npz_bytes()]
    (tmp_path / "train.npz").write_bytes(b"".join(parts))
    index = build_index([str(tmp_path / "train.npz")])
    assert index.length.tolist() == [len(p) for p in parts]
    assert [_sample_bytes(index, i) for i in range(len(index))] == parts
    reader = SampleReader(index)
    np.testing.assert_array_equal(reader[3]["y"], np.full((3, 2), 3))
    np.testing.assert_array_equal(reader[5]["z"], np.arange(50))
    assert reader[6] == {}


@pytest.mark.parametrize("given", ["corpus", "corpus.bin", "corpus.idx"])
@pytest.mark.parametrize("modes", [False, True], ids=["plain", "multimodal"])
def test_megatron_bin_idx(tmp_path, given, modes):
    sequences = [np.array([5, 6, 7], np.uint16), np.array([1], np.uint16), np.array([9, 9, 9, 9, 2], np.uint16)]
    (tmp_path / "corpus.bin").write_bytes(b"".join(s.tobytes() for s in sequences))
    (tmp_path / "corpus.idx").write_bytes(megatron_idx([3, 1, 5], 8, 2, [0, 2, 3], modes))
    index = build_index([str(tmp_path / given)], "megatron" if given == "corpus" else None)
    assert (index.sample_format, index.dtype, [f.name for f in index.files]) == ("megatron", "uint16", ["corpus.bin"])
    assert index.offset.tolist() == [0, 6, 8] and index.length.tolist() == [6, 2, 10]
    reader = SampleReader(index)
    assert [reader[i].tolist() for i in range(3)] == [s.tolist() for s in sequences]


def test_megatron_int32_tokens(tmp_path):
    (tmp_path / "m.bin").write_bytes(np.arange(6, dtype=np.int32).tobytes())
    (tmp_path / "m.idx").write_bytes(megatron_idx([2, 4], 4, 4, [0, 2]))
    index = build_index([str(tmp_path / "m.bin")])
    assert index.dtype == "int32" and SampleReader(index)[1].tolist() == [2, 3, 4, 5]


def test_tfrecord(tmp_path):
    payloads = [b"", b"a", b"record two", bytes(range(256)) * 3]
    (tmp_path / "a.tfrecord").write_bytes(b"".join(encode_record(p) for p in payloads[:2]))
    (tmp_path / "b.tfrecord").write_bytes(b"".join(encode_record(p) for p in payloads[2:]))
    index = build_index([str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")])
    assert index.length.tolist() == [len(p) + 16 for p in payloads] and index.offset.tolist() == [0, 16, 0, 26]
    reader = SampleReader(index)
    assert [reader[i] for i in range(4)] == payloads
    assert _sample_bytes(index, 3) == encode_record(payloads[3])


def test_fingerprint_moves_with_the_dataset_and_changes_with_it(tmp_path):
    src = tmp_path / "a"
    src.mkdir()
    for i in range(3):
        np.save(src / f"{i}.npy", np.arange(i + 2))
    before = build_index([str(src)])
    shutil.copytree(src, tmp_path / "b")
    moved = build_index([str(tmp_path / "b")])
    assert moved.fingerprint == before.fingerprint and moved.root != before.root
    np.save(tmp_path / "b" / "1.npy", np.arange(4))
    assert build_index([str(tmp_path / "b")]).fingerprint != before.fingerprint


def test_fsspec_urls(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    blobs = [npy_bytes(np.arange(k)) for k in range(1, 4)]
    for k, b in enumerate(blobs):
        fs.pipe(f"/ds/s{k}.npy", b)
    index = build_index(["memory://ds/"])
    assert [f.name for f in index.files] == ["s0.npy", "s1.npy", "s2.npy"]
    assert SampleReader(index).read(2) == blobs[2]
    local = tmp_path / "t.tfrecord"
    local.write_bytes(encode_record(b"x") + encode_record(b"yz"))
    url_index = build_index([f"file://{local}"])
    assert SampleReader(url_index)[1] == b"yz"


def _zip64(archive: bytes) -> bytes:
    """`archive` rewritten with zip64 forms: central entries keep their local-header offsets in a
    zip64 extra (offset 0xFFFFFFFF), and a zip64 end record and locator precede the end record."""
    eocd = archive.rindex(b"PK\x05\x06")
    _, _, _, entries, _, cd_offset, _ = struct.unpack_from("<HHHHIIH", archive, eocd + 4)
    central, pos = b"", cd_offset
    for _ in range(entries):
        fields = list(struct.unpack_from("<4sHHHHHHIIIHHHHHII", archive, pos))
        nlen, xlen, clen, offset = fields[10], fields[11], fields[12], fields[16]
        name = archive[pos + 46 : pos + 46 + nlen]
        extra = archive[pos + 46 + nlen : pos + 46 + nlen + xlen] + struct.pack("<HHQ", 1, 8, offset)
        fields[11], fields[16] = len(extra), 0xFFFFFFFF
        central += struct.pack("<4sHHHHHHIIIHHHHHII", *fields) + name + extra
        pos += 46 + nlen + xlen + clen
    z64_at = cd_offset + len(central)
    z64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, len(central), cd_offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, z64_at, 1)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return archive[:cd_offset] + central + z64 + locator + end


def test_zip64_records(tmp_path):
    plain = npz_bytes(x=np.arange(3), y=np.ones(2))
    wide = _zip64(plain)
    assert zipfile.ZipFile(io.BytesIO(wide)).testzip() is None  # a valid zip by Python's reader
    (tmp_path / "z.npz").write_bytes(plain + wide + plain)
    index = build_index([str(tmp_path / "z.npz")])
    assert index.length.tolist() == [len(plain), len(wide), len(plain)]
    np.testing.assert_array_equal(SampleReader(index)[1]["x"], np.arange(3))


def _descriptor_zip() -> bytes:
    """A zip written to an unseekable stream, so its sizes follow the data (flag bit 3)."""

    class Unseekable(io.BytesIO):
        def tell(self) -> int:
            raise OSError("unseekable")

        def seek(self, *args) -> int:
            raise OSError("unseekable")

    out = Unseekable()
    with zipfile.ZipFile(out, "w") as z, z.open("x.npy", "w") as f:
        f.write(npy_bytes(np.arange(3)))
    return out.getvalue()


def _absolute_offsets_zip(prefix: bytes) -> bytes:
    """`prefix` followed by a zip whose offsets count from the start of the file, not the archive."""
    buf = io.BytesIO()
    buf.write(prefix)
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("x.npy", npy_bytes(np.arange(2)))
    return buf.getvalue()


def _idx(**kw) -> bytes:
    return megatron_idx(**{"lengths": [2, 2], "dtype_code": 8, "itemsize": 2, "documents": [0, 2], **kw})


NPZ = npz_bytes(x=np.arange(4))  # 288 bytes
RECORD = encode_record(b"ab")
BAD_INPUTS = [  # files to write, the path to index, the message after "<tmp>/"
    pytest.param(
        {"a.npy": npy_bytes(np.arange(5))[:-8]},
        "a.npy",
        "a.npy: header says shape [5] of int64 (168 bytes in all), the file has 160",
        id="npy_truncated",
    ),
    pytest.param(
        {"a.npy": b"\x93NUMPX" + bytes(20)},
        "a.npy",
        "a.npy: neither .npy (magic b'\\x93NUMPY') nor .npz (zip 'PK'): starts with b'\\x93NUMPX'",
        id="npy_magic",
    ),
    pytest.param(
        {"a.npy": npy_bytes(np.array([None], dtype=object))},
        "a.npy",
        "a.npy: dtype object holds Python objects (pickles are not loaded)",
        id="npy_object",
    ),
    pytest.param(
        {"a.npz": NPZ + NPZ[:100]},
        "a.npz",
        "a.npz: archive 1 at offset 288: truncated: entry at 0 has 160 data bytes past the end of the file",
        id="npz_truncated_data",
    ),
    pytest.param(
        {"a.npz": NPZ + NPZ[:-30]},
        "a.npz",
        "a.npz: archive 1 at offset 288: truncated: a central directory entry needs 42 bytes at offset 507, only 39 left",
        id="npz_truncated_directory",
    ),
    pytest.param(
        {"a.npz": NPZ + b"junk"},
        "a.npz",
        "a.npz: archive 1 at offset 288: expected a zip record signature at offset 288, found b'junk'",
        id="npz_trailing_junk",
    ),
    pytest.param(
        {"a.npz": _descriptor_zip()},
        "a.npz",
        "a.npz: archive 0 at offset 0: entry at 0 uses a data descriptor (sizes unknown up front)",
        id="npz_data_descriptor",
    ),
    pytest.param(
        {"a.npz": _absolute_offsets_zip(NPZ)},
        "a.npz",
        "a.npz: archive 1 at offset 288: end record says (entries, directory size, directory offset) = (1, 51, 467), parsed (1, 51, 179) (not a concatenation of whole .npz archives?)",
        id="npz_absolute_offsets",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": b"MMIDIDY\x00\x00" + _idx()[9:]},
        "m",
        "m.idx: magic: expected b'MMIDIDX\\x00\\x00', got b'MMIDIDY\\x00\\x00'",
        id="megatron_magic",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx()[:9] + struct.pack("<Q", 2) + _idx()[17:]},
        "m.idx",
        "m.idx: version: expected 1, got 2",
        id="megatron_version",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx(dtype_code=9)},
        "m.bin",
        "m.idx: dtype code: 9 is not one of [1, 2, 3, 4, 5, 6, 7, 8]",
        id="megatron_dtype",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx()[:-3]},
        "m.bin",
        "m.idx: size 71 bytes, but 2 sequences and 2 document indices need 74 (or 76 with modes)",
        id="megatron_idx_truncated",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx()[:20]},
        "m.bin",
        "m.idx: truncated: the header needs 34 bytes at offset 0, only 20 left",
        id="megatron_header_cut",
    ),
    pytest.param(
        {"m.bin": bytes(6), "m.idx": _idx()},
        "m.bin",
        "sample 1 of m.bin: range [4, 8) is not a non-empty range inside the file's 6 bytes",
        id="megatron_range_beyond_bin",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx(lengths=[4, 0])},
        "m.bin",
        "m.idx: sequence_lengths[1]: 0 tokens; a sample needs at least 1",
        id="megatron_empty_sequence",
    ),
    pytest.param(
        {"m.bin": bytes(8), "m.idx": _idx(documents=[0, 1])},
        "m.bin",
        "m.idx: document_indices: expected a non-decreasing list from 0 to 2, got [0, 1]...[0, 1]",
        id="megatron_documents",
    ),
    pytest.param(
        {"m.bin": bytes(8)}, "m.bin", "m.idx: cannot open: No such file or directory", id="megatron_missing_idx"
    ),
    pytest.param(
        {"t.tfrecord": RECORD[:8] + bytes(4) + RECORD[12:]},
        "t.tfrecord",
        "t.tfrecord: record 0 at offset 0: length CRC 0x00000000 does not match",
        id="tfrecord_length_crc",
    ),
    pytest.param(
        {"t.tfrecord": encode_record(b"ok") + RECORD[:-1] + b"\0"},
        "t.tfrecord",
        "t.tfrecord: record 1 at offset 18: data CRC",
        id="tfrecord_data_crc",
    ),
    pytest.param(
        {"t.tfrecord": encode_record(b"abcdef")[:-2]},
        "t.tfrecord",
        "t.tfrecord: record 0 at offset 0: truncated: 6 data bytes end at 22, the file has 20",
        id="tfrecord_truncated",
    ),
    pytest.param(
        {"t.tfrecord": RECORD + b"\x01\x00"},
        "t.tfrecord",
        "t.tfrecord: truncated: record 1's header needs 12 bytes at offset 18, only 2 left",
        id="tfrecord_header_cut",
    ),
    pytest.param(
        {"a.csv": b"1,2"},
        "a.csv",
        "a.csv: cannot tell the dataset format from the extension; give one of ['numpy', 'megatron', 'tfrecord']",
        id="unknown_extension",
    ),
    pytest.param({}, "gone.tfrecord", "gone.tfrecord: cannot stat: No such file or directory", id="missing_file"),
    pytest.param({"d/.keep": b""}, "d", "d: no .npy or .npz files in the directory", id="empty_directory"),
]


@pytest.mark.parametrize(("files", "target", "message"), BAD_INPUTS)
def test_bad_inputs_name_the_file(tmp_path, files, target, message):
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError) as info:
        build_index([str(tmp_path / target)])
    expected = message if message.startswith("sample") else f"{tmp_path}/{message}"
    assert str(info.value).startswith(expected), str(info.value)


def test_mixed_formats_and_duplicates(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(2))
    (tmp_path / "t.tfrecord").write_bytes(encode_record(b"x"))
    with pytest.raises(DataError, match=re.escape("dataset files of mixed or unknown formats ['numpy', 'tfrecord']")):
        build_index([str(tmp_path / "a.npy"), str(tmp_path / "t.tfrecord")])
    with pytest.raises(DataError, match="file 'a.npy' appears twice in the file table"):
        build_index([str(tmp_path / "a.npy"), os.path.join(str(tmp_path), ".", "a.npy")])
    with pytest.raises(DataError, match="no dataset files given"):
        build_index([])
