"""Pipeline DeepSpeed checkpoints (`PipelineModule`, `layer_*` files): DeepSpeed's PipelineEngine
saves at PP 2 x DP 2, tenplex reshards PP and DP with the stages DeepSpeed would build, the
PipelineEngine loads at the new layout (`engine.load_checkpoint`): every parameter, fp32 master,
both Adam moments and the step as saved, bit for bit."""

from __future__ import annotations

import random
import shutil

import attrs
import pytest
import torch

from fixtures.deepspeed.pipe import load_pipe
from tenplex.frameworks.deepspeed import DeepSpeedError, read_deepspeed, reshard_deepspeed
from tenplex.frameworks.deepspeed.pipe import methods, partition_balanced, partition_uniform
from tenplex.frameworks.deepspeed.stages import parts_for
from tenplex.frameworks.formats import inspect
from tests.frameworks.deepspeed.conftest import assert_same_state

TAG = "global_step2"


@pytest.mark.parametrize("to, pp, dp", [("dp=1,pp=3", 3, 1), ("dp=2,pp=1", 1, 2), ("dp=1", 2, 1)])
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pipeline_reshards_and_deepspeed_loads_it(pipe2, tmp_path, to, pp, dp):
    ckpt, saved = pipe2
    r = reshard_deepspeed(ckpt, to, tmp_path / "o")
    assert (r.src_pp, r.pp, r.src_dp, r.dp) == (2, pp, 2, dp)
    names = sorted(f.name for f in (tmp_path / "o" / TAG).iterdir())
    assert names == sorted([f"layer_0{i}-model_states.pt" for i in range(7)] + [f"mp_rank_0{s}_model_states.pt" for s in range(pp)]
                           + [f"zero_pp_rank_{d}_mp_rank_0{s}_optim_states.pt" for s in range(pp) for d in range(dp)])  # fmt: skip
    assert_same_state(load_pipe(tmp_path / "o", pp, dp, tmp_path), saved)


def test_stages_are_deepspeeds():
    """tenplex's copies of DeepSpeed's partition functions give DeepSpeed's stages."""
    from deepspeed.runtime.utils import partition_balanced as ds_balanced
    from deepspeed.runtime.utils import partition_uniform as ds_uniform

    rng = random.Random(0)
    for _ in range(200):
        n, p = rng.randint(1, 12), rng.randint(1, 6)
        w = [rng.choice([0, 0, 3, 10, 42, 100]) for _ in range(n)]
        assert partition_uniform(n, p) == [int(x) for x in ds_uniform(n, p)]
        assert partition_balanced(w, p) == [int(x) for x in ds_balanced(w, p)]
    assert methods([96, 0, 51, 0, 16, 0, 10], [{0}, {2, 4, 6}]) == ("parameters",)
    assert methods([1, 1, 1, 1], [{0, 1}, {2, 3}]) == ("parameters", "uniform")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_what_cannot_be_known_is_refused(pipe2, tmp_path):
    ckpt, _ = pipe2
    meta = read_deepspeed(ckpt)[3]
    assert (meta.pp, meta.parts, meta.pp_methods) == (2, (0, 2, 7), ("parameters",))
    both = attrs.evolve(meta, pp_methods=("parameters", "uniform"))
    assert parts_for(both, 2) == (0, 2, 7)
    with pytest.raises(DeepSpeedError, match=r"fit both .*\(parameters: \[0, 2, 4, 7\], uniform: \[0, 3, 5, 7\]"):
        parts_for(both, 3)
    with pytest.raises(DeepSpeedError, match="neither of DeepSpeed's partition methods"):
        parts_for(attrs.evolve(meta, pp_methods=()), 3)
    with pytest.raises(DeepSpeedError, match="stages .* leave a stage without layers"):
        parts_for(meta, 8)
    with pytest.raises(DeepSpeedError, match="cannot change TP 1 -> 2: a pipeline checkpoint keeps TP 1"):
        reshard_deepspeed(ckpt, "dp=1,tp=2", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    lines = inspect(str(ckpt))
    assert "a pipeline of 2 stage(s) (mp_rank_00..01, 7 layer_* files)" in lines[0]
    assert "  pipeline stages hold layers [0, 2), [2, 7) (partition_method 'parameters'); TP stays 1" in lines


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tied_layers_are_refused(pipe2, tmp_path):
    src = tmp_path / "ck"
    shutil.copytree(pipe2[0], src)
    path = src / TAG / "mp_rank_01_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["param_shapes"][0] = {
        ("tied_modules.embed.weight" if k == "6.weight" else k): v for k, v in state["param_shapes"][0].items()
    }
    torch.save(state, path)
    with pytest.raises(
        DeepSpeedError, match=r"parameter 'tied_modules.embed.weight' of param_shapes is not in a layer file"
    ):
        read_deepspeed(src)
