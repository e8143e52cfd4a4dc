"""`tenplex reshard --from/--format` and `tenplex inspect DIR` over the checkpoint formats:
Megatron-LM trees (built by the tests' independent builder), DCP directories, tenplex directories;
format detection, cross-format conversion, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from fixtures.megatron.tree import build_tree  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.formats import detect  # noqa: E402
from tenplex.frameworks.megatron.read import read_megatron  # noqa: E402
from tenplex.frontends.spec import parse_spec  # noqa: E402
from tenplex.runtime.checkpoint.directory import read_checkpoint  # noqa: E402
from tests.frameworks.test_dcp_files import sharded_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    spec = parse_spec("gpt-tiny:tp2,pp2@1x4")
    root = tmp_path_factory.mktemp("meg") / "a"
    build_tree(root, spec.model, spec.parallel)
    return root


@pytest.fixture
def dcp_dir(tmp_path):
    write_dcp(*sharded_state(), tmp_path / "d")
    return tmp_path / "d"


def test_detect_names_each_format_and_rejects_others(megatron, dcp_dir, tmp_path):
    assert detect(megatron) == "megatron" and detect(dcp_dir) == "dcp"
    with pytest.raises(Exception, match=r"not a checkpoint tenplex reads \(no ptc.json"):
        detect(tmp_path)


def test_megatron_reshard_and_inspect(megatron, tmp_path, tenplex):
    code, out, err = tenplex("reshard", str(megatron), "--to", "tp=4,pp=1", "--out", str(tmp_path / "b"))
    assert code == 0, err
    got = read_megatron(tmp_path / "b")
    assert (got.meta.parallel.tp, got.meta.parallel.pp) == (4, 1)
    code, out, err = tenplex("inspect", str(tmp_path / "b"))
    assert code == 0, err
    assert "Megatron legacy checkpoint" in out and "layout: tp=4, pp=1" in out


def test_megatron_to_tenplex_directory_keeps_every_logical_byte(megatron, tmp_path, tenplex):
    out_dir = tmp_path / "npy"
    code, out, err = tenplex("reshard", str(megatron), "--to", "tp=1,pp=1", "--format", "tenplex", "--out", str(out_dir))
    assert code == 0, err
    ptc, arrays, values = read_checkpoint(out_dir)
    src = read_megatron(megatron)
    assert {t.name for t in ptc.tensors} == {t.name for t in src.ptc.tensors}
    # tp=1, pp=1: every tensor is whole in one sub-tensor; compare with the source pieces
    whole = {ptc.subtensor_map[sid].tensor: a for sid, a in arrays.items() if ptc.subtensor_map[sid].pieces[0].global_box.shape == a.shape}
    compared = 0
    for st in src.ptc.subtensors:
        if st.tensor in whole and not any(p.flat for p in st.pieces):
            for p in st.pieces:
                want = src.arrays[st.id][p.local_box.to_slices()]
                assert np.array_equal(whole[st.tensor][p.global_box.to_slices()].view(np.uint8), want.view(np.uint8))
                compared += want.nbytes
    assert compared > 0.5 * sum(a.nbytes for a in src.arrays.values())
    code, out, err = tenplex("inspect", str(out_dir))
    assert code == 0 and "tenplex checkpoint directory" in out


def test_dcp_reshard_to_a_mesh_layout(dcp_dir, tmp_path, tenplex):
    layout = json.dumps({"format": "tenplex.dtensor-layout/1", "mesh": [2], "placements": {}})
    code, out, err = tenplex("reshard", str(dcp_dir), "--to", layout, "--out", str(tmp_path / "e"))
    assert code == 0, err
    src, src_arrays, _ = read_dcp(dcp_dir)
    ptc, arrays, _ = read_dcp(tmp_path / "e")
    assert len(src.partitions) == 4 and len(ptc.partitions) == 2  # one .distcp per rank of the 2-rank mesh
    assert {t.name: t.shape for t in ptc.tensors} == {t.name: t.shape for t in src.tensors}
    assert sum(a.nbytes for a in arrays.values()) >= sum(a.nbytes for a in src_arrays.values())
    code, out, err = tenplex("inspect", str(tmp_path / "e"))
    assert code == 0 and "DCP checkpoint" in out and "2 data files" in out, out + err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "megatron", "--to", "gpt-tiny:tp1,pp1@1x1"], "Megatron output needs a Megatron source"),
        (["--central", "--to", "tp=1,pp=1"], "--central applies to tenplex checkpoint directories only"),
    ],
)
def test_impossible_requests_are_one_line_errors(megatron, dcp_dir, tmp_path, tenplex, args, message):
    src = dcp_dir if "--format" in args else megatron
    code, out, err = tenplex("reshard", str(src), *args, "--out", str(tmp_path / "x"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_reference_structure_directories_are_ptcs_for_compile_and_inspect(tmp_path, tenplex):
    from tenplex.frameworks.structure.read import write_structure

    dirs = []
    for name, text in (("a", "gpt-tiny:tp2,pp2@1x4"), ("b", "gpt-tiny:tp1,pp2,dp2@1x4")):
        spec = parse_spec(text)
        build_tree(tmp_path / f"meg-{name}", spec.model, spec.parallel)
        dirs.append(write_structure(tmp_path / f"meg-{name}", tmp_path / f"struct-{name}"))
    code, out, err = tenplex("compile", str(dirs[0]), str(dirs[1]), "--emit", "text")
    assert code == 0, err
    assert "network bytes:" in out
    code, out, err = tenplex("inspect", str(dirs[0]))
    assert code == 0 and "problems: none" in out, out + err
    code, out, err = tenplex("reshard", str(dirs[0]), "--to", "tp=1,pp=1", "--out", str(tmp_path / "x"))
    assert code == 2 and "structure directory (shapes only, no data)" in err


def test_reshard_workers_are_bounded(tenplex, tmp_path):
    code, _, err = tenplex("reshard", str(tmp_path), "--to", "tp=1", "--out", str(tmp_path / "o"), "--workers", "100000")
    assert code == 2 and err.count("\n") == 1 and "--workers" in err and "1<=x<=256" in err, err
