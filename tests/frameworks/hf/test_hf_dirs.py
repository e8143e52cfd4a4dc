"""Hugging Face directories that are not whole: a half-written or mismatched index, chunks that
overlap or leave a gap, and `tenplex inspect` / `reshard` on them (one line naming what is
missing, never a guess at another format). Also DCP's distributed HF save (chunks in files)."""

import json
import shutil

import numpy as np
import pytest

from tenplex.frameworks.formats import FormatError, detect
from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.read import read_hf
from tenplex.frameworks.hf.write import parse_target, whole_ptc, write_hf
from tests.frameworks.hf.test_hf_header import _file, _whole

TENSORS = {"a.w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int16)}


@pytest.fixture
def sharded(tmp_path):
    ptc, arrays = _whole(TENSORS)
    write_hf(ptc, arrays, {"model": {"step": 3}}, tmp_path / "hf", max_shard_bytes=16)
    return tmp_path / "hf"


def test_sharded_output_follows_save_pretrained(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert index == {"metadata": {"total_size": 58}, "weight_map": {"a.w": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    ptc, arrays, values = read_hf(sharded)
    assert values == {"model-00001-of-00002": {"step": 3}, "model-00002-of-00002": {}}
    assert all(arrays[k].tobytes() == a.tobytes() for k, a in TENSORS.items())


def test_a_shard_the_index_names_is_missing(sharded, tenplex):
    (sharded / "model-00002-of-00002.safetensors").unlink()
    assert detect(sharded) == "hf"
    code, out, err = tenplex("inspect", str(sharded))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "model.safetensors.index.json: names model-00002-of-00002.safetensors (for 1 tensor(s), e.g. 'b'), which is missing" in err


def test_a_file_that_disagrees_with_the_index(sharded):
    doc = json.loads((sharded / "model.safetensors.index.json").read_text())
    doc["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(doc))
    with pytest.raises(HfError, match=r"model-00001-of-00002.safetensors: lacks 'b', which model.safetensors.index.json maps to it"):
        read_hf(sharded)


def test_an_index_escaping_the_directory_is_refused(sharded):
    doc = {"weight_map": {"a.w": "../x.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(doc))
    with pytest.raises(HfError, match=r"weight_map file of 'a.w' '../x.safetensors' cannot be a relative file path"):
        read_hf(sharded)


def _sharding_file(path, offsets: dict, shape=(2,)):
    info = json.dumps({k: {"saved_offsets": o} for k, o in offsets.items()})
    nbytes = 4 * int(np.prod(shape))
    header = {"__metadata__": {"DCP_SHARDING_INFO": info}, "w": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, nbytes]}}
    path.mkdir(exist_ok=True)
    shutil.move(_file(path, header, bytes(nbytes)), path / f"shard-{len(list(path.iterdir())):05d}.safetensors")


def test_chunks_placed_by_dcp_sharding_info(tmp_path):
    _sharding_file(tmp_path / "d", {"w": [0]})
    _sharding_file(tmp_path / "d", {"w": [2]})
    ptc, _, _ = read_hf(tmp_path / "d")
    assert ptc.tensor_map["w"].shape == (4,) and sorted(st.id for st in ptc.subtensors) == ["w@[0]", "w@[2]"]
    _sharding_file(tmp_path / "d", {"w": [1]})
    with pytest.raises(HfError, match=r"tensor 'w' chunks .* overlap"):
        read_hf(tmp_path / "d")


def test_a_missing_chunk_is_a_gap(tmp_path):
    _sharding_file(tmp_path / "d", {"w": [0]})
    _sharding_file(tmp_path / "d", {"w": [3]})
    with pytest.raises(HfError, match=r"tensor 'w' region \[\[2, 3\]\] is in no file"):
        read_hf(tmp_path / "d")


def test_bad_sharding_info_names_the_entry(tmp_path):
    _sharding_file(tmp_path / "d", {"w": [0, 0]})
    with pytest.raises(HfError, match=r"DCP_SHARDING_INFO entry 'w' is \{'saved_offsets': \[0, 0\]\}"):
        read_hf(tmp_path / "d")


@pytest.mark.parametrize(("text", "want"), [("whole", None), ("max_shard_size=5GB", 5 * 10**9), ("max_shard_size=2MiB", 2 << 20), ("max_shard_size = 100", 100)])
def test_parse_target(text, want):
    assert parse_target(text) == want


@pytest.mark.parametrize("text", ["tp=2,pp=1", "max_shard_size=0", "max_shard_size=5XB", "{}"])
def test_a_bad_target_names_the_syntax(text):
    with pytest.raises(HfError, match="safetensors output takes 'whole' or 'max_shard_size=SIZE'"):
        parse_target(text)


def test_write_refuses_a_ptc_that_is_not_whole(tmp_path):
    from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc

    ptc, _ = _whole(TENSORS)
    cut = dst_ptc(ptc, MeshLayout.from_json('{"mesh": [2], "placements": {"a.w": ["S(0)"]}}'))
    with pytest.raises(HfError, match=r"tensor 'a.w' is held as 2 sub-tensor\(s\), not whole"):
        write_hf(cut, {}, {}, tmp_path / "x")
    with pytest.raises(HfError, match=r"tensor 'a.w' has float64\[3, 4\], expected float32\[3, 4\]"):
        write_hf(whole_ptc(ptc), {**TENSORS, "a.w": TENSORS["a.w"].astype(np.float64)}, {}, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x*"))


def test_unknown_and_unfinished_directories_get_one_line(tmp_path, tenplex):
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(FormatError, match=r"has .distcp data files but no .metadata: a DCP save that did not finish"):
        detect(tmp_path / "dcp")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "weights.bin").write_bytes(b"x")
    code, _, err = tenplex("inspect", str(tmp_path / "other"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and ".metadata, *.safetensors" in err


def test_cli_reshard_from_and_to_hf(sharded, tmp_path, tenplex):
    layout = json.dumps({"mesh": [2], "placements": {"a.w": ["S(0)"]}})
    code, out, err = tenplex("reshard", str(sharded), "--from", "hf", "--to", layout, "--format", "tenplex", "--out", str(tmp_path / "t"))
    assert code == 0 and "resharded hf" in out, err
    code, out, err = tenplex("reshard", str(tmp_path / "t"), "--to", "whole", "--format", "hf", "--out", str(tmp_path / "h"))
    assert code == 0, err
    _, arrays, values = read_hf(tmp_path / "h")
    assert all(arrays[k].tobytes() == a.tobytes() for k, a in TENSORS.items()) and values == {"model": {"step": 3}}
    code, out, err = tenplex("inspect", str(tmp_path / "h"))
    assert code == 0 and out.splitlines()[0].endswith("Hugging Face safetensors checkpoint, 1 file(s), 2 tensors (58 B; 1 float32, 1 int16)")
    assert "tensor a.w: float32[3, 4] in model" in out and "model.safetensors: non-tensor values from tenplex" in out


def test_sharding_info_that_is_not_an_object(tmp_path):
    header = {"__metadata__": {"DCP_SHARDING_INFO": "[1]"}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    _file(tmp_path, header, bytes(4))
    with pytest.raises(HfError, match=r"model.safetensors: __metadata__ DCP_SHARDING_INFO is not a JSON object"):
        read_hf(tmp_path)


def test_layout_of_an_hf_directory_is_a_starting_point_for_reshard(tmp_path, tenplex):
    _sharding_file(tmp_path / "d", {"w": [0]})
    _sharding_file(tmp_path / "d", {"w": [2]})
    code, out, err = tenplex("layout", str(tmp_path / "d"))
    assert code == 0 and json.loads(out) == {"format": "tenplex.dtensor-layout/1", "mesh": [2], "placements": {"w": ["S(0)"], "*": ["R"]}}, err
    code, _, err = tenplex("layout", str(tmp_path / "d"), "-o", str(tmp_path / "l.json"))
    code, out, err = tenplex("reshard", str(tmp_path / "d"), "--to", str(tmp_path / "l.json"), "--format", "hf", "--out", str(tmp_path / "o"))
    assert code == 2 and "safetensors output takes 'whole' or 'max_shard_size=SIZE'" in err and not (tmp_path / "o").exists()
