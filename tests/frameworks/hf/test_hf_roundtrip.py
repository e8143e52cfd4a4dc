"""Hugging Face directories written by the peers' own code (transformers' `save_pretrained`, DCP's
`HuggingFaceStorageWriter`), read by tenplex bit for bit, resharded into a TPxPP job and
consolidated back: `from_pretrained`, `safetensors.torch.load_file` and DCP's
`HuggingFaceStorageReader` load the result with every bit equal."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from fixtures.hf import save_dcp_hf, save_pretrained, tiny_gpt2, tiny_llama  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.formats import convert, detect  # noqa: E402
from tenplex.frameworks.hf.read import read_hf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
STAGE0, STAGE1 = ["Stage(0)", "S(0)"], ["Stage(1)", "S(0)"]  # pipeline stage x tensor-parallel rows
TPXPP = {"mesh": [2, 2], "placements": {"model.layers.0.*": STAGE0, "transformer.h.0.*": STAGE0, "model.layers.1.*": STAGE1,
                                        "transformer.h.1.*": STAGE1, "*.weight": STAGE1, "*": ["Stage(0)", "R"]}}  # fmt: skip


def _no_spec(to):
    raise AssertionError(f"no PTC file or spec expected, got {to!r}")


def _bits(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and _bits(got[k]) == _bits(t), k


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    llama, gpt2 = tiny_llama("bfloat16"), tiny_gpt2("float32")
    return {"llama": (llama, save_pretrained(llama, root / "llama")),
            "gpt2": (gpt2, save_pretrained(gpt2, root / "gpt2", max_shard_size="30KB"))}  # fmt: skip


def _files(d):
    return {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_save_pretrained_reads_bit_for_bit(models, name):
    _, path = models[name]
    assert detect(path) == "hf" and (len(list(path.glob("*.safetensors"))) > 1) == (name == "gpt2")
    ptc, arrays, values = read_hf(path)
    assert values == {p.id: {} for p in ptc.partitions}
    want = _files(path)
    assert {t.name for t in ptc.tensors} == set(want)
    for t in ptc.tensors:
        (st,) = ptc.by_tensor[t.name]
        assert arrays[st.id].tobytes() == _bits(want[t.name]) and t.dtype == str(want[t.name].dtype).removeprefix("torch.")


@pytest.mark.parametrize(("name", "to"), [("llama", "whole"), ("gpt2", "max_shard_size=20KB"), ("llama", "max_shard_size=16KiB")])
def test_tpxpp_and_back_loads_with_from_pretrained_bit_for_bit(models, tmp_path, name, to):
    model, path = models[name]
    done = convert(str(path), json.dumps(TPXPP), str(tmp_path / "tpxpp"), _no_spec, fmt="dcp")
    assert done.src_format == "hf" and len(read_dcp(tmp_path / "tpxpp")[0].partitions) == 4
    convert(str(tmp_path / "tpxpp"), to, str(tmp_path / "back"), _no_spec, fmt="hf")
    files = sorted(p.name for p in (tmp_path / "back").iterdir())
    assert (files == ["model.safetensors"]) == (to == "whole") and ("model.safetensors.index.json" in files) == (to != "whole")
    _same(_files(tmp_path / "back"), _files(path))
    for config in (model.config, model.generation_config):  # tenplex writes the weights; the configs are the model's
        config.save_pretrained(tmp_path / "back")
    loaded = type(model).from_pretrained(tmp_path / "back", dtype=model.dtype)
    _same(loaded.state_dict(), model.state_dict())


def test_dcp_hf_storage_reader_loads_what_tenplex_writes(models, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    model, path = models["llama"]
    convert(str(path), "max_shard_size=20KB", str(tmp_path / "out"), _no_spec, fmt="hf")
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(tmp_path / "out")), no_dist=True)
    _same(state, model.state_dict())


def test_dcp_hf_storage_writer_output_reads_bit_for_bit(models, tmp_path):
    model, _ = models["llama"]
    sd = model.state_dict()
    out = save_dcp_hf(dict(sd), tmp_path / "dcp-hf", {k: 1 + i % 3 for i, k in enumerate(sorted(sd))})
    ptc, arrays, _ = read_hf(out)
    assert len(ptc.partitions) == 3 and sorted(p.id for p in ptc.partitions)[0] == "model-00001-of-00003"
    assert {t.name for t in ptc.tensors} == set(sd)
    assert all(arrays[k].tobytes() == _bits(v) and arrays[k].shape == v.shape for k, v in sd.items())


def test_values_survive_hf_and_back(tmp_path):
    from tenplex.frameworks.dcp.write import write_dcp
    from tests.frameworks.test_dcp_files import sharded_state

    ptc, arrays, values = sharded_state()
    write_dcp(ptc, arrays, values, tmp_path / "dcp")
    convert(str(tmp_path / "dcp"), "whole", str(tmp_path / "hf"), _no_spec, fmt="hf")
    _, _, back = read_hf(tmp_path / "hf")
    _, _, src = read_dcp(tmp_path / "dcp")
    assert back == {"model": {k: v for p in src.values() for k, v in p.items()}}
