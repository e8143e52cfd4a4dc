"""DeepSpeed saves, tenplex reshards to another DP world size, DeepSpeed loads
(`engine.load_checkpoint`, optimizer state included): every byte as saved. Also DeepSpeed's own
path (`ds_to_universal`, universal load) as the reference, and tenplex reading its output."""

from __future__ import annotations

import pytest
import torch

from fixtures.deepspeed.engine import load, to_universal
from tenplex.frameworks.deepspeed import reshard_deepspeed
from tests.frameworks.deepspeed.conftest import assert_same_state

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]


def test_zero2_two_ranks_to_one(zero2, tmp_path):
    ckpt, saved = zero2
    r = reshard_deepspeed(ckpt, "dp=1", tmp_path / "dp1")
    assert (r.src_dp, r.dp) == (2, 1) and r.bytes_moved > 0
    assert_same_state(load(tmp_path / "dp1", 1, 2, tmp_path), saved)


def test_zero1_bf16_elastic_one_rank_to_two(zero1, tmp_path):
    ckpt, saved = zero1
    reshard_deepspeed(ckpt, "dp=2", tmp_path / "dp2")
    assert sorted(f.name for f in (tmp_path / "dp2" / "global_step2").iterdir()) == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "mp_rank_00_model_states.pt"]  # fmt: skip
    assert saved["0.weight"]["module"].dtype == torch.bfloat16
    assert_same_state(load(tmp_path / "dp2", 2, 1, tmp_path, bf16=True, elastic=True), saved)


def test_universal_from_ds_to_universal_writes_the_same_files(zero2, tmp_path):
    """ds_to_universal's output resharded to DP 3 holds exactly what the ZeRO source resharded to
    DP 3 holds (which DeepSpeed loads bit for bit, as the tests above show for DP 1 and 2)."""
    ckpt, _ = zero2
    to_universal(ckpt / "global_step2", tmp_path / "uni")
    reshard_deepspeed(tmp_path / "uni", "dp=3", tmp_path / "from-uni")  # the root: latest_universal names the tag
    reshard_deepspeed(ckpt, "dp=3", tmp_path / "from-zero")
    a, b = tmp_path / "from-uni" / "global_step2_universal", tmp_path / "from-zero" / "global_step2"
    assert sorted(f.name for f in a.iterdir()) == sorted(f.name for f in b.iterdir())
    for f in b.iterdir():
        x, y = torch.load(a / f.name, weights_only=False), torch.load(f, weights_only=False)
        assert _same(x, y, f.name), f.name


def _same(x, y, where: str) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k], f"{where}/{k}") for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(x, y)))
    return x == y or (type(x).__name__ == type(y).__name__ and vars(x) == vars(y))
