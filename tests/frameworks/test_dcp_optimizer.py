"""A real `dcp.save` of a model and its AdamW optimizer (0-d `step` tensors, bfloat16 weights,
param_groups as values) through `tenplex reshard --format tenplex` and back to DCP: the tenplex
directory keeps every shape (0-d stays 0-d, issue 13 item 11) and DCP's own loader reads the
round trip byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.runtime.checkpoint.directory import read_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def trained_state() -> dict:
    """{"model", "optim"} of a small model after one AdamW step, as DCP state dicts."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    model[1].to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    model[1](model[0](x).to(torch.bfloat16)).float().sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


@pytest.fixture
def saved(tmp_path):
    dcp.save(trained_state(), checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    return tmp_path / "ck"


def _flat(sd: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in sd.items():
        key = f"{prefix}{k}"
        out |= _flat(v, key + ".") if isinstance(v, dict) else {key: v}
    return out


def _load(path) -> dict:
    """DCP's own loader into a fresh state of the same structure (zeros, placeholders)."""
    fresh = trained_state()
    for t in _flat(fresh).values():
        if isinstance(t, torch.Tensor):
            t.zero_()
    dcp.load(fresh, checkpoint_id=str(path), no_dist=True)
    return _flat(fresh)


@pytest.mark.parametrize(
    "mesh, workers",
    [
        ("[1]", 1),
        ("[2]", 1),
        pytest.param("[2]", 2, marks=[pytest.mark.multiprocess, pytest.mark.slow], id="[2]-agents"),
    ],
)
def test_optimizer_state_through_the_tenplex_format_and_back(saved, tmp_path, tenplex, mesh, workers):
    npy = tmp_path / "npy"
    code, out, err = tenplex("reshard", str(saved), "--to", f'{{"mesh": {mesh}}}', "--format", "tenplex",
                             "--out", str(npy), "--workers", str(workers))  # fmt: skip
    assert code == 0, err
    ptc, arrays, _ = read_checkpoint(npy)
    steps = [st for st in ptc.subtensors if st.tensor.endswith(".step")]
    assert steps and all(st.shape == () and arrays[st.id].shape == () for st in steps)
    code, out, err = tenplex("reshard", str(npy), "--to", str(npy / "ptc.json"), "--format", "dcp",
                             "--out", str(tmp_path / "back"))  # fmt: skip
    assert code == 0, err
    want, got = _load(saved), _load(tmp_path / "back")
    assert want.keys() == got.keys()
    for key, w in want.items():
        g = got[key]
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape, key
            assert g.view(-1).view(torch.uint8).numpy().tobytes() == w.view(-1).view(torch.uint8).numpy().tobytes(), key
        else:
            assert g == w, key
    assert any(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 for w in want.values())
    assert np.isfinite([float(w) for k, w in want.items() if k.endswith(".step")]).all()
