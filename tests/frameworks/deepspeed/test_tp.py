"""Tensor-parallel DeepSpeed checkpoints (Megatron-like model, `mpu` with TP x DP gloo groups):
DeepSpeed saves at TP 2 x DP 2, tenplex reshards TP and DP using the split the model files'
`universal_checkpoint_info` gives, DeepSpeed loads at the new TP x DP (`engine.load_checkpoint`):
every parameter, fp32 master, both Adam moments and the step equal the saved state cut for the
new TP, bit for bit. Also DeepSpeed's own path (`ds_to_universal` + universal load)."""

from __future__ import annotations

import shutil

import pytest
import torch

from fixtures.deepspeed.engine import to_universal
from fixtures.deepspeed.tp import VP, V, load_tp, merge
from tenplex.frameworks.deepspeed import DeepSpeedError, read_deepspeed, reshard_deepspeed
from tenplex.frameworks.formats import inspect
from tests.frameworks.deepspeed.conftest import assert_same_state

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]
TAG = "global_step2"


def test_tp2_to_tp1_and_back_to_tp2(tp2, tmp_path):
    ckpt, saved = tp2
    r = reshard_deepspeed(ckpt, "dp=1,tp=1", tmp_path / "tp1")
    assert (r.src_tp, r.tp, r.src_dp, r.dp) == (2, 1, 2, 1) and "TP 2 -> 1, DP 2 -> 1" in r.summary()
    assert sorted(f.name for f in (tmp_path / "tp1" / TAG).iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # fmt: skip
    assert_same_state(merge(load_tp(tmp_path / "tp1", 1, 1, 2, tmp_path)), saved)
    reshard_deepspeed(tmp_path / "tp1", "dp=1,tp=2", tmp_path / "back")  # 1 -> 2: the split rides in the model file
    assert_same_state(merge(load_tp(tmp_path / "back", 2, 1, 2, tmp_path)), saved)


def test_tp2_dp2_to_tp4_dp1(tp2, tmp_path):
    ckpt, saved = tp2
    reshard_deepspeed(ckpt, "dp=1,tp=4", tmp_path / "tp4")
    model = torch.load(tmp_path / "tp4" / TAG / "mp_rank_03_model_states.pt", weights_only=False)
    assert model["mp_world_size"] == 4 and model["checkpoint_parallel_dimensions"]["tp_degree"] == 4
    assert model["param_shapes"][0]["embed.weight"] == torch.Size([VP // 4, 5]) and model["module"][
        "row.weight"
    ].shape == (5, 3)
    states = load_tp(tmp_path / "tp4", 4, 1, 2, tmp_path)
    assert_same_state(merge(states), saved)
    assert states[3]["embed.weight"]["fp32"].shape == (VP // 4, 5)  # the padded vocabulary kept, cut in 4


def test_without_universal_checkpoint_info_only_dp_changes(tp2, tmp_path):
    ckpt, saved = tp2
    src = tmp_path / "ck"
    shutil.copytree(ckpt, src)
    for m in range(2):
        path = src / TAG / f"mp_rank_0{m}_model_states.pt"
        state = torch.load(path, weights_only=False)
        del state["universal_checkpoint_info"]
        torch.save(state, path)
    with pytest.raises(DeepSpeedError, match=r"cannot change TP 2 -> 1: no 'universal_checkpoint_info' in the model files .*"
                                             r"a DP-only change \(tp=2\) works") as e:  # fmt: skip
        reshard_deepspeed(src, "dp=1,tp=1", tmp_path / "no")
    assert "\n" not in str(e.value) and not (tmp_path / "no").exists()
    reshard_deepspeed(src, "dp=1", tmp_path / "dp1")
    assert_same_state(merge(load_tp(tmp_path / "dp1", 2, 1, 2, tmp_path)), saved)


def test_deepspeeds_own_path_agrees_except_the_vocab_padding(tp2, tmp_path):
    """ds_to_universal + universal load at TP 1 gives what tenplex gives, but for the padded
    vocabulary rows, which DeepSpeed strips and refills with zeros (tenplex keeps them)."""
    ckpt, saved = tp2
    to_universal(ckpt / TAG, tmp_path / "uni")
    with pytest.raises(
        DeepSpeedError, match="key 'mp_world_size' is 2: tenplex reads universal checkpoints of one model-parallel rank"
    ):
        read_deepspeed(tmp_path / "uni")
    got = merge(load_tp(tmp_path / "uni", 1, 1, 2, tmp_path, universal=True))
    for kind, t in got["embed.weight"].items():
        assert torch.equal(t[:V], saved["embed.weight"][kind][:V]) and not t[V:].any(), kind
        if kind in ("module", "fp32"):
            assert saved["embed.weight"][kind][V:].any()  # tenplex keeps these (test above); DeepSpeed zeroes them
        got["embed.weight"][kind] = saved["embed.weight"][kind]
    assert_same_state(got, saved)


def test_tp_layouts_that_do_not_fit_are_refused(tp2, tmp_path):
    ckpt, _ = tp2
    with pytest.raises(
        DeepSpeedError, match=r"dim 0 of 'embed.weight' \[12, 5\] does not divide by 5 \(a padded vocabulary"
    ):
        reshard_deepspeed(ckpt, "dp=1,tp=5", tmp_path / "o")
    with pytest.raises(DeepSpeedError, match=r"not a pipeline checkpoint .no layer_\* files.: pp must be 1"):
        reshard_deepspeed(ckpt, "dp=1,pp=2", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    src = tmp_path / "ck"
    shutil.copytree(ckpt, src)
    path = src / TAG / "mp_rank_01_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["module"]["norm.weight"][0] += 1
    torch.save(state, path)
    with pytest.raises(
        DeepSpeedError, match="mp_rank_01_model_states.pt: module/norm.weight differs from model-parallel rank 0's"
    ):
        read_deepspeed(src)
    (src / TAG / "zero_pp_rank_1_mp_rank_01_optim_states.pt").unlink()
    with pytest.raises(
        DeepSpeedError, match=r"optimizer file of DP rank 1 missing \(zero_pp_rank_1_mp_rank_01_optim_states.pt\)"
    ):
        read_deepspeed(src)
    (src / TAG / "mp_rank_00_model_states.pt").rename(src / TAG / "mp_rank_02_model_states.pt")
    with pytest.raises(DeepSpeedError, match="mp_rank_00_model_states.pt missing"):
        read_deepspeed(src)


def test_cli_reshards_tp(tp2, tmp_path, tenplex):
    code, out, _ = tenplex(
        "reshard", str(tp2[0]), "--from", "deepspeed", "--to", "tp=1,dp=3", "--out", str(tmp_path / "o")
    )
    assert code == 0 and "TP 2 -> 1, DP 2 -> 3" in out
    _, _, _, meta = read_deepspeed(tmp_path / "o")
    assert (meta.tp, meta.dp, meta.why_fixed) == (1, 3, "")


def test_inspect_describes_the_tp_split(tp2):
    lines = inspect(str(tp2[0]))
    text = "\n".join(lines)
    assert lines[0].startswith("DeepSpeed ZeRO stage 2 checkpoint") and "TP 2 (mp_rank_00..01)" in lines[0]
    assert "split dim 0 (column): embed.weight, col.weight, col.bias" in text
    assert "split dim 1 (row): row.weight" in text and "replicated: norm.weight, row.bias" in text
    assert "--to dp=N,tp=M" in text
