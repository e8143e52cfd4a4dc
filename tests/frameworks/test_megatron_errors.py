"""A file that does not match its claimed layout raises CheckpointFormatError naming the file and
the key; one named case per message."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fixtures.megatron.tree import build_tree
from tenplex.frameworks import CheckpointFormatError, inspect_megatron
from tenplex.frameworks.megatron.read import read_megatron
from tenplex.frontends.spec import parse_spec
from tenplex.ir.errors import TenplexError

STEP = "iter_0000100"
R01 = f"{STEP}/mp_rank_01_001/model_optim_rng.pt"
R00 = f"{STEP}/mp_rank_00_000/model_optim_rng.pt"
QKV = "model/language_model/encoder/layers.0.self_attention.query_key_value.weight"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    spec = parse_spec("gpt-tiny:tp2,pp2@1x4")
    build_tree(root / "plain", spec.model, spec.parallel)
    spec = parse_spec("gpt-tiny:tp2,pp2,zero1,dp2@1x8")
    build_tree(root / "zero", spec.model, spec.parallel)
    return root


def edit(root: Path, rel: str, change: Callable[[dict], None]) -> None:
    path = root / rel
    state = torch.load(path, weights_only=False)
    change(state)
    torch.save(state, path)


def encoder(state: dict) -> dict:
    return state["model"]["language_model"]["encoder"]


def _set_args(**fields):
    def change(state: dict) -> None:
        for k, v in fields.items():
            setattr(state["args"], k, v)

    return change


CASES = {  # name: (tree, mutation of the root, file named, key named)
    "missing_tracker": ("plain", lambda r: (r / "latest_checkpointed_iteration.txt").unlink(),
                        "latest_checkpointed_iteration.txt", "missing"),
    "bad_tracker": ("plain", lambda r: (r / "latest_checkpointed_iteration.txt").write_text("latest"),
                    "latest_checkpointed_iteration.txt", "'latest'"),
    "missing_rank_file": ("plain", lambda r: (r / R01).unlink(), R01, "rank tp=1, pp=1"),
    "unexpected_rank_dir": ("plain", lambda r: shutil.copytree(r / STEP / "mp_rank_01_001", r / STEP / "mp_rank_02_001"),
                            "mp_rank_02_001", "tp=2, pp=2"),
    "wrong_shape": ("plain", lambda r: edit(r, R00, lambda s: encoder(s).__setitem__(
        "layers.0.self_attention.query_key_value.weight", torch.zeros(5, 64, dtype=torch.bfloat16))), R00, QKV),
    "wrong_dtype": ("plain", lambda r: edit(r, R00, lambda s: encoder(s).__setitem__(
        "layers.0.self_attention.query_key_value.weight", torch.zeros(96, 64))), R00, QKV),
    "unknown_key": ("plain", lambda r: edit(r, R00, lambda s: encoder(s).__setitem__(
        "layers.0.mlp.gate.weight", torch.zeros(3))), R00, "model/language_model/encoder/layers.0.mlp.gate.weight"),
    "missing_key": ("plain", lambda r: edit(r, R00, lambda s: encoder(s).pop("layers.1.input_norm.bias")),
                    R00, "model/language_model/encoder/layers.1.input_norm.bias"),
    "missing_adam_state": ("plain", lambda r: edit(r, R01, lambda s: s["optimizer"]["optimizer"]["state"].pop(3)),
                           R01, "optimizer/optimizer/state/3/exp_avg"),
    "missing_optimizer": ("plain", lambda r: edit(r, R01, lambda s: s.pop("optimizer")), R01, "'optimizer' missing"),
    "missing_master": ("plain", lambda r: edit(r, R00, lambda s: s["optimizer"]["fp32_from_fp16_params"][1].pop()),
                       R00, "optimizer/fp32_from_fp16_params/1"),
    "group_size": ("plain", lambda r: edit(r, R00, lambda s: s["optimizer"]["optimizer"]["param_groups"][0]["params"].pop()),
                   R00, "optimizer/optimizer/param_groups/0/params"),
    "iteration_mismatch": ("plain", lambda r: edit(r, R01, lambda s: s.__setitem__("iteration", 99)), R01, "'iteration'"),
    "vpp_chunks": ("plain", lambda r: edit(r, R00, lambda s: s.__setitem__("model1", {})), R00, "'model1'"),
    "unsupported_moe": ("plain", lambda r: edit(r, R00, _set_args(num_experts=8)), R00, "args.num_experts=8"),
    "vocab_mismatch": ("plain", lambda r: edit(r, R00, _set_args(vocab_size=2000)), R00, "args.padded_vocab_size=1024"),
    "missing_distrib_optim": ("zero", lambda r: (r / STEP / "mp_rank_01_001" / "distrib_optim.pt").unlink(),
                              f"{STEP}/mp_rank_01_001/distrib_optim.pt", "missing"),
    "distrib_numel": ("zero", lambda r: edit(r, f"{STEP}/mp_rank_00_000/distrib_optim.pt",
                                             lambda s: next(iter(s[0].values())).__setitem__("numel_unpadded", 7)),
                      f"{STEP}/mp_rank_00_000/distrib_optim.pt", "numel_unpadded' is 7"),
    "distrib_short_buffer": ("zero", lambda r: edit(r, f"{STEP}/mp_rank_00_000/distrib_optim.pt",
                                                    lambda s: next(iter(s[0].values())).__setitem__("exp_avg", torch.zeros(3))),
                             f"{STEP}/mp_rank_00_000/distrib_optim.pt", "exp_avg' is float32[3]"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_names_file_and_key(name, pristine, tmp_path):
    tree, mutate, file, key = CASES[name]
    root = tmp_path / "ckpt"
    shutil.copytree(pristine / tree, root)
    mutate(root)
    with pytest.raises(CheckpointFormatError) as info:
        read_megatron(root)
    message = str(info.value)
    assert isinstance(info.value, TenplexError)
    assert str(root / file) in message or (file in message and str(root) in message), message
    assert key in message, message


def test_inspect_raises_when_unreadable(pristine, tmp_path):
    """A checkpoint that cannot be read is an error (the CLI exits 2), not a finding."""
    shutil.copytree(pristine / "plain", tmp_path / "ckpt")
    (tmp_path / "ckpt" / R01).unlink()
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{tmp_path / 'ckpt' / R01}: missing")):
        inspect_megatron(tmp_path / "ckpt")


def test_inspect_findings(pristine):
    text = "\n".join(inspect_megatron(pristine / "zero"))
    for phrase in ("iteration 100", "tp=2, pp=2, dp=2", "distributed optimizer", "1000 rows padded to 1024",
                   "word_embeddings_for_head", "fp32 master weights", "model-parallel-rng"):  # fmt: skip
        assert phrase in text, phrase
    assert re.search(r"max difference .*: 0\)", text)
