"""Unknown, half-written or foreign DeepSpeed directories get one line naming what is missing or
wrong, never a guess; what tenplex writes reads back as it was and names DeepSpeed's classes."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from tenplex.frameworks.deepspeed import (
    DeepSpeedError,
    build_ptc,
    parse_dp,
    read_deepspeed,
    reshard_deepspeed,
    write_deepspeed,
)
from tenplex.frameworks.formats import FormatError, detect, inspect

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # the session fixture runs DeepSpeed ranks
TAG = "global_step2"


@pytest.fixture
def copy(zero2, tmp_path):
    shutil.copytree(zero2[0], tmp_path / "ck")
    return tmp_path / "ck"


def _error(path, match: str) -> str:
    with pytest.raises(DeepSpeedError, match=match) as e:
        read_deepspeed(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_half_written_saves_name_the_missing_file(copy):
    (copy / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert detect(copy) == "deepspeed"
    _error(copy, r"optimizer file of DP rank 1 missing \(zero_pp_rank_1_mp_rank_00_optim_states.pt; partition_count says DP 2")
    (copy / TAG / "mp_rank_00_model_states.pt").unlink()
    _error(copy / TAG, "mp_rank_00_model_states.pt missing")
    (copy / "latest").write_text("global_step9")
    _error(copy, "names tag 'global_step9', but .* is missing")


def test_unknown_directories_are_not_guessed(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(FormatError, match="not a checkpoint tenplex reads"):
        detect(tmp_path)
    _error(tmp_path, "not a DeepSpeed checkpoint")


def test_layouts_tenplex_does_not_read_are_refused(copy):
    shutil.copy(copy / TAG / "mp_rank_00_model_states.pt", copy / TAG / "layer_01-model_00-model_states.pt")
    _error(copy, "layer_01-model_00-model_states.pt: ZeRO-3 files and pipelines with tensor parallelism are not read")
    (copy / TAG / "layer_01-model_00-model_states.pt").rename(copy / TAG / "mp_rank_01_model_states.pt")
    _error(copy, r"optimizer file of DP rank 0 missing \(zero_pp_rank_0_mp_rank_01_optim_states.pt\)")
    for bad in ("dp=2,pp=0", "dp=0", "tp=1", "dp=2,dp=3", "dp=x", "dp=1,ep=2"):
        with pytest.raises(DeepSpeedError, match="--to"):
            parse_dp(bad)
    assert parse_dp("dp=4,tp=1,pp=1") == 4


def test_a_file_that_disagrees_with_the_layout_names_the_key(copy):
    path = copy / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    state = torch.load(path, weights_only=False)
    state["optimizer_state_dict"]["group_paddings"] = [0, 0]
    torch.save(state, path)
    _error(copy, r"zero_pp_rank_1_mp_rank_00_optim_states.pt: key 'group_paddings' is \[0, 0\]")


def test_foreign_pickled_classes_are_refused_unless_trusted(copy):
    path = copy / TAG / "mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["client"] = subprocess.CompletedProcess(["x"], 0)
    torch.save(state, path)
    _error(copy, "refusing to unpickle '.*CompletedProcess'.*--trust-pickles")
    assert read_deepspeed(copy, trust_pickles=True)[3].model_states["client"].returncode == 0


def test_written_files_name_deepspeeds_classes(zero2, tmp_path):
    """tenplex pickles its stand-ins under DeepSpeed's names, so DeepSpeed's unpickler builds its
    own classes (tenplex itself never imports DeepSpeed: an import-linter contract)."""
    out = tmp_path / "dp3"
    reshard_deepspeed(zero2[0], "dp=3", out)
    path = out / TAG / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path))) == {
        "deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.utils.tensor_fragment.fragment_address"}  # fmt: skip
    real = torch.load(path, weights_only=False)["optimizer_state_dict"]
    assert type(real["loss_scaler"]).__module__ == "deepspeed.runtime.fp16.loss_scaler"
    assert real["partition_count"] == [3, 3] and real["param_slice_mappings"][0]
    lines = inspect(str(out))
    assert lines[0].startswith("DeepSpeed ZeRO stage 2 checkpoint")
    assert "DP 3" in lines[1] and "2 param group(s), 6 parameters" in lines[2]


def test_cli_reshard_and_refusals(zero2, tmp_path, tenplex):
    code, out, _ = tenplex("reshard", str(zero2[0]), "--from", "deepspeed", "--to", "dp=3", "--out", str(tmp_path / "o"))
    assert code == 0 and "DP 2 -> 3" in out
    with pytest.raises(DeepSpeedError, match="already exists"):
        reshard_deepspeed(zero2[0], "dp=3", tmp_path / "o")
    code, _, err = tenplex("reshard", str(tmp_path / "o"), "--format", "deepspeed", "--to", "x.json", "--out", str(tmp_path / "p"))
    assert code == 2 and "DeepSpeed output needs a DeepSpeed source and a layout like dp=4" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("dp", [1, 2, 5])
def test_written_arrays_read_back_bit_for_bit(zero2, tmp_path, dp):
    """Through the writer's array path (the one agents feed): write any DP, read it back, write
    the source's DP again: the same arrays as the source's."""
    src, arrays, _, meta = read_deepspeed(zero2[0])
    out = build_ptc(meta, dp)
    by_tensor = {}
    for st in src.subtensors:
        by_tensor.setdefault(st.tensor, []).append(arrays[st.id].reshape(-1))
    flat = {t: np.concatenate(parts) for t, parts in by_tensor.items()}  # the source's 2 ranks, in DP order
    mine, starts = {}, {}
    for st in out.subtensors:
        at = starts.get(st.tensor, 0)
        mine[st.id] = flat[st.tensor][at:at + st.shape[0]] if st.tensor.startswith(("fp32/", "exp_avg")) else flat[st.tensor]
        starts[st.tensor] = at + st.shape[0]
    write_deepspeed(out, mine, meta, dp, tmp_path / "w")
    _, back, _, meta2 = read_deepspeed(tmp_path / "w")
    assert meta2.dp == dp and back.keys() == mine.keys()
    assert all(back[k].tobytes() == mine[k].tobytes() for k in mine)
