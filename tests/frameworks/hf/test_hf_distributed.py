"""DCP's `HuggingFaceStorageWriter(save_distributed=True)` in two gloo processes: one file per
rank holding its chunks (placed by DCP_SHARDING_INFO, no index); tenplex reads the tensors whole,
bit for bit, and consolidates them into a `model.safetensors` that safetensors loads."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from fixtures.hf import distributed_tensors, save_dcp_hf_distributed  # noqa: E402
from tenplex.frameworks.formats import convert, inspect  # noqa: E402
from tenplex.frameworks.hf.read import read_hf  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _bits(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_distributed_hf_save_reads_and_consolidates(tmp_path):
    from safetensors.torch import load_file

    root = save_dcp_hf_distributed(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == [f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2)]
    ptc, _, _ = read_hf(root)
    assert len(ptc.by_tensor["w"]) == 2 and ptc.tensor_map["w"].shape == (8, 6)
    assert "tensor w: bfloat16[8, 6] cut into 2 chunks in 2 files" in inspect(str(root))
    convert(str(root), "whole", str(tmp_path / "whole"), None, fmt="hf")
    got = load_file(str(tmp_path / "whole" / "model.safetensors"))
    want = distributed_tensors(2)
    assert sorted(got) == sorted(want) and all(_bits(got[k]) == _bits(v) and got[k].dtype == v.dtype for k, v in want.items())
