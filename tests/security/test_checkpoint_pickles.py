"""A malicious checkpoint must not run code (issue 12, item 2).

Megatron rank files are unpickled with `weights_only=True` and an allow-list of the classes these
files hold; DCP `.metadata` with a restricted unpickler that allows only DCP's metadata classes.
A pickle that would run code (here: a `__reduce__` that creates a marker file) is refused, without
running it, by `tenplex inspect` and `tenplex reshard` and the library readers, with one line
naming the file and the class; `--trust-pickles` (`trust_pickles=True`) opts in."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402

from fixtures.megatron.tree import build_tree  # noqa: E402
from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.megatron.read import read_megatron  # noqa: E402
from tenplex.frameworks.megatron.tree import CheckpointFormatError  # noqa: E402
from tenplex.frontends.spec import parse_spec  # noqa: E402
from tests.frameworks.test_dcp_files import sharded_state  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(60)]
HEAD = "iter_0000100/mp_rank_00/model_optim_rng.pt"


class Marker:
    """Unpickling it creates a directory (and leaves None): the stand-in for arbitrary code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.makedirs, (self.path,))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("meg") / "m"
    spec = parse_spec("gpt-tiny:tp1,pp1@1x1")
    build_tree(root, spec.model, spec.parallel)
    return root


@pytest.fixture
def evil_megatron(pristine, tmp_path):
    import shutil

    root = shutil.copytree(pristine, tmp_path / "m")
    state = torch.load(root / HEAD, weights_only=False)
    state["args"].evil = Marker(tmp_path / "pwned")
    torch.save(state, root / HEAD)
    return root, tmp_path / "pwned"


@pytest.fixture
def evil_dcp(tmp_path):
    write_dcp(*sharded_state(), tmp_path / "d")
    md = pickle.loads((tmp_path / "d" / ".metadata").read_bytes())
    md.storage_meta.modules.append(Marker(tmp_path / "pwned"))
    (tmp_path / "d" / ".metadata").write_bytes(pickle.dumps(md))
    return tmp_path / "d", tmp_path / "pwned"


def test_megatron_pickle_is_refused_without_running(evil_megatron):
    root, marker = evil_megatron
    with pytest.raises(CheckpointFormatError, match=rf"{root / HEAD}: .*os\.makedirs.*--trust-pickles") as info:
        read_megatron(root)
    assert "\n" not in str(info.value) and not marker.exists()
    read_megatron(root, trust_pickles=True)
    assert marker.exists()


def test_dcp_metadata_pickle_is_refused_without_running(evil_dcp):
    root, marker = evil_dcp
    with pytest.raises(DcpError, match=rf"{root / '.metadata'}: .*os\.makedirs.*--trust-pickles") as info:
        read_dcp(root)
    assert "\n" not in str(info.value) and not marker.exists()
    read_dcp(root, trust_pickles=True)
    assert marker.exists()


@pytest.mark.parametrize("fmt", ["megatron", "dcp"])
def test_cli_inspect_and_reshard_refuse_and_opt_in(fmt, evil_megatron, evil_dcp, tenplex, tmp_path):
    root, marker = evil_megatron if fmt == "megatron" else evil_dcp
    to = "tp=1,pp=1" if fmt == "megatron" else json.dumps({"mesh": [2]})
    code, out, err = tenplex("inspect", str(root))
    assert code == 2 and err.startswith("tenplex: error: ") and "--trust-pickles" in err and not marker.exists(), err
    code, out, err = tenplex("reshard", str(root), "--to", to, "--out", str(tmp_path / "o1"))
    assert code == 2 and "--trust-pickles" in err and not marker.exists() and not (tmp_path / "o1").exists(), err
    code, out, err = tenplex("inspect", str(root), "--trust-pickles")
    assert code == 0 and marker.exists(), err
    marker.rmdir()
    code, out, err = tenplex("reshard", str(root), "--to", to, "--out", str(tmp_path / "o2"), "--trust-pickles")
    assert code == 0 and marker.exists(), err


def test_megatron_files_of_every_fixture_layout_read_safely(tmp_path):
    """The allow-list covers what the synthetic trees hold (Namespace, numpy RNG state, ...)."""
    for i, (spec, options) in enumerate([("gpt-tiny:tp2,pp2@1x4", {}), ("gpt-tiny:tp2,pp1,zero1,dp2@1x4", {"naming": "mcore"}),
                                         ("gpt-tiny:tp1,pp2,vpp2@1x2", {"naming": "mcore-te", "version": 0})]):  # fmt: skip
        s = parse_spec(spec)
        build_tree(tmp_path / str(i), s.model, s.parallel, **options)
        read_megatron(tmp_path / str(i))


def test_megatron_args_enum_of_an_allowed_module_reads(pristine, tmp_path, monkeypatch):
    """Enums Megatron pickles in args (megatron.*.enums) are allowed when that module is installed."""
    import enum
    import shutil
    import sys
    import types

    mod = types.ModuleType("megatron.core.enums")
    mod.ModelType = enum.Enum("ModelType", [("encoder_or_decoder", 1)], module="megatron.core.enums")
    for name in ("megatron", "megatron.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "megatron.core.enums", mod)
    root = shutil.copytree(pristine, tmp_path / "m")
    state = torch.load(root / HEAD, weights_only=False)
    state["args"].model_type = mod.ModelType.encoder_or_decoder
    torch.save(state, root / HEAD)
    assert read_megatron(root).meta.args.model_type is mod.ModelType.encoder_or_decoder


def test_real_dcp_save_with_optimizer_state_reads(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 3, "path": Path("/x")}
    dcp.save(state, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    ptc, arrays, values = read_dcp(tmp_path / "ck")
    names = {t.name for t in ptc.tensors}
    assert "model.0.weight" in names and "optim.state.0.exp_avg" in names, sorted(names)
    assert values["__0_0"]["step"] == 3
