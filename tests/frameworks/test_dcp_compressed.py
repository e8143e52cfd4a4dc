"""DCP checkpoints saved with torch's own ZStandard stream transform by `dcp.save` in two gloo
processes: tenplex reads them bit for bit (tensors and values), reshards them, describes them,
and refuses unknown transforms, corrupt frames and a missing zstandard package by name."""

import pickle
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zstandard")

from fixtures.zstd import full_tensors, save_zstd  # noqa: E402
from tenplex.frameworks.dcp import transforms  # noqa: E402
from tenplex.frameworks.dcp.describe import inspect_dcp  # noqa: E402
from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp, read_index  # noqa: E402
from tenplex.frameworks.dcp.reshard import reshard_dcp  # noqa: E402
from tenplex.frameworks.dtensor.values import python_value  # noqa: E402
from tests.frameworks.test_dcp_pickled import same_as_torch  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


@pytest.fixture(scope="module")
def zstd_dir(tmp_path_factory):
    return save_zstd(tmp_path_factory.mktemp("zstd"))


@pytest.fixture
def copy(zstd_dir, tmp_path):
    return shutil.copytree(zstd_dir, tmp_path / "c")


def _bits(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _assembled(ptc, arrays, name, like):
    out = np.zeros(like.shape, arrays[ptc.by_tensor[name][0].id].dtype)
    for st in ptc.by_tensor[name]:
        out[st.pieces[0].global_box.to_slices()] = arrays[st.id]
    return out


def test_read_bit_for_bit_with_values(zstd_dir):
    index = read_index(zstd_dir)
    assert index.entries and all(e.transforms == ("stream.zstd/1",) for e in index.entries)
    ptc, arrays, values = read_dcp(zstd_dir)
    for name, t in full_tensors(2).items():
        assert _assembled(ptc, arrays, name, t).tobytes() == _bits(t), name
    merged = {k: python_value(v) for p in values.values() for k, v in p.items()}
    assert merged == {"step": 7, "meta": ("a", 1)}
    same_as_torch(zstd_dir / ".metadata")  # the transform descriptors through dcp.pickled's stand-ins
    lines = inspect_dcp(zstd_dir)
    assert "6 of 6 entries compressed with ZStandard (stream.zstd/1): read through zstandard into memory" in lines


def test_reshard_decompresses_into_a_plain_checkpoint(zstd_dir, tmp_path):
    reshard_dcp(zstd_dir, '{"mesh": [3], "placements": {"model.w": ["S(0)"]}}', tmp_path / "out")
    assert not any(e.transforms for e in read_index(tmp_path / "out").entries)
    ptc, arrays, _ = read_dcp(tmp_path / "out")
    w = full_tensors(2)["model.w"]
    assert len(ptc.by_tensor["model.w"]) == 3 and _assembled(ptc, arrays, "model.w", w).tobytes() == _bits(w)


def test_torch_loads_the_fixture_the_same(zstd_dir):
    import torch.distributed.checkpoint as dcp

    full = full_tensors(2)
    state = {k: torch.zeros_like(v) for k, v in full.items()}
    dcp.load(state, checkpoint_id=str(zstd_dir), no_dist=True)
    assert all(_bits(state[k]) == _bits(v) for k, v in full.items())


def _edit_metadata(root, edit):
    md = pickle.loads((root / ".metadata").read_bytes())
    for info in md.storage_data.values():
        edit(info)
    (root / ".metadata").write_bytes(pickle.dumps(md))


def test_an_unknown_transform_is_refused_by_name(copy):
    _edit_metadata(copy, lambda info: setattr(info, "transform_descriptors", ["stream.lz4/1"]))
    with pytest.raises(DcpError, match=r"uses stream transform 'stream.lz4/1', which tenplex does not read \(it reads stream.zstd/1\)"):
        read_index(copy)
    _edit_metadata(copy, lambda info: setattr(info, "transform_descriptors", ["stream.zstd/2"]))
    with pytest.raises(DcpError, match=r"'stream.zstd/2', which tenplex does not read"):
        read_index(copy)


def test_a_corrupt_frame_names_file_and_entry(copy):
    data = bytearray((copy / "__0_0.distcp").read_bytes())
    data[4:12] = b"\xff" * 8
    (copy / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(DcpError, match=r"__0_0.distcp: .* at bytes \[\d+, \d+\) is not a complete ZStandard frame of at most \d+ bytes"):
        read_dcp(copy)


def test_a_frame_larger_than_its_entry_is_refused(zstd_dir, monkeypatch):
    monkeypatch.setattr(transforms, "SLACK", 0)  # a chunk's torch.save archive is larger than its bare data
    with pytest.raises(DcpError, match=r"is not a complete ZStandard frame of at most \d+ bytes \(decompression error"):
        read_dcp(zstd_dir)


def test_without_zstandard_the_error_says_what_to_install(zstd_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(DcpError, match=r"compressed with ZStandard \(stream.zstd\), which needs the zstandard package: pip install 'tenplex\[zstd\]'"):
        read_dcp(zstd_dir)


def test_an_empty_compressed_entry_is_not_a_frame(copy):
    def empty(info):
        info.offset, info.length = 0, 0

    _edit_metadata(copy, empty)
    (copy / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(DcpError, match=r"__0_0.distcp: .* at bytes \[0, 0\) is not a complete ZStandard frame"):
        read_dcp(copy)


def test_a_truncated_frame_is_refused(copy):
    def shorter(info):
        info.length -= 5

    _edit_metadata(copy, shorter)
    with pytest.raises(DcpError, match=r"is not a complete ZStandard frame .*did not decompress full frame"):
        read_dcp(copy)
