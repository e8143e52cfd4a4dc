"""Checkpoints DeepSpeed itself saved (fixtures.deepspeed.engine), once per session: ZeRO-2 with
two DP ranks and ZeRO-1 with one (bf16, `elastic_checkpoint`), each with the full state the
saving engine held."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def zero2(tmp_path_factory):
    """(checkpoint root, full state) of ZeRO-2 trained and saved with 2 ranks."""
    from fixtures.deepspeed.engine import train_and_save

    tmp = tmp_path_factory.mktemp("ds-zero2")
    return tmp / "ck", train_and_save(tmp / "ck", 2, 2, tmp)


@pytest.fixture(scope="session")
def zero1(tmp_path_factory):
    """(checkpoint root, full state) of ZeRO-1 with bf16 weights and elastic optimizer files,
    trained and saved with 1 rank."""
    from fixtures.deepspeed.engine import train_and_save

    tmp = tmp_path_factory.mktemp("ds-zero1")
    return tmp / "ck", train_and_save(tmp / "ck", 1, 1, tmp, bf16=True, elastic=True)


def assert_same_state(got: dict, want: dict) -> None:
    """Every parameter's module weight, fp32 master and moments, and every group's step, bit for bit."""
    assert got.keys() == want.keys()
    for name, parts in want.items():
        if name == "step":
            assert [s.item() for s in got[name]] == [s.item() for s in parts]
            continue
        for kind, t in parts.items():
            g = got[name][kind]
            assert g.dtype == t.dtype and g.shape == t.shape, (name, kind)
            assert g.view(-1).view(torch.int32 if g.dtype == torch.float32 else torch.int16).equal(
                t.view(-1).view(torch.int32 if t.dtype == torch.float32 else torch.int16)), (name, kind)


@pytest.fixture(scope="session")
def tp2(tmp_path_factory):
    """(checkpoint root, full reference state) of the Megatron-like TP model (fixtures.deepspeed.tp)
    trained by ZeRO-2 with TP 2 x DP 2 and saved; the reference is the TP ranks' state concatenated."""
    from fixtures.deepspeed.tp import merge, train_and_save_tp

    tmp = tmp_path_factory.mktemp("ds-tp2")
    return tmp / "ck", merge(train_and_save_tp(tmp / "ck", 2, 2, 2, tmp))


@pytest.fixture(scope="session")
def pipe2(tmp_path_factory):
    """(checkpoint root, full state) of a PipelineModule (fixtures.deepspeed.pipe) trained by
    DeepSpeed's PipelineEngine with 2 stages x DP 2 and saved."""
    from fixtures.deepspeed.pipe import train_and_save_pipe

    tmp = tmp_path_factory.mktemp("ds-pipe2")
    return tmp / "ck", train_and_save_pipe(tmp / "ck", 2, 2, tmp)
