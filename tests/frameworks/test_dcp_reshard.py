"""`reshard_dcp` and its dst layout format in one process: the JSON format and its errors, the
default "source placements on the new mesh", resharded output loaded by DCP's own loader,
atomicity (nothing written on error), 2 workers through the agent runtime, `inspect_dcp`."""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.frameworks.dcp import write as dcp_write  # noqa: E402
from tenplex.frameworks.dcp.describe import inspect_dcp  # noqa: E402
from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.dcp.reshard import reshard_dcp  # noqa: E402
from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate, Shard, coordinates, local_box  # noqa: E402
from tenplex.frameworks.dtensor.convert import to_numpy  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard  # noqa: E402
from tenplex.frameworks.dtensor.mesh import FORMAT, MeshLayout, dst_ptc, source_placements  # noqa: E402
from tests.frameworks.test_dcp_files import GLOBAL, VALUES, sharded_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
S, R = Shard, Replicate


@pytest.fixture
def src_dir(tmp_path):
    ptc, arrays, values = sharded_state()
    dcp_write.write_dcp(ptc, arrays, values, tmp_path / "a")
    return tmp_path / "a"


def test_layout_json_roundtrip_and_rules():
    doc = {"format": FORMAT, "mesh": [2, 3], "placements": {"model.w": ["S(1)", "R"], "optim.*": ["R", "S(0)"], "*": ["R", "R"]}}
    layout = MeshLayout.from_json(json.dumps(doc))
    assert MeshLayout.from_json(layout.to_json()) == layout and layout.to_json() == doc
    src, _, _ = sharded_state()
    meta = src.tensor_map
    assert layout.placements_for(meta["model.w"], ()) == (S(1), R())
    assert layout.placements_for(meta["optim.state.w.step"], ()) == (R(), R())  # 0-d: "optim.*" does not fit
    assert layout.placements_for(meta["model.b"], ()) == (R(), R())


def test_default_is_source_placements_on_the_new_mesh():
    src, _, _ = sharded_state()
    assert source_placements(src, "model.w", 2) == (S(0), S(1))
    assert source_placements(src, "model.w", 1) == (S(0),)
    assert source_placements(src, "model.b", 2) == (S(0), R())
    assert source_placements(src, "optim.state.w.step", 3) == (R(), R(), R())
    dst = dst_ptc(src, MeshLayout((3,)))
    assert [p.id for p in dst.partitions] == ["rank0", "rank1", "rank2"]
    assert dst.subtensor_map["model.w@rank2"].shape == (1, 5)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"mesh": [2], "placement": {}}, "layout: unknown key 'placement'"),
        ({"placements": {}}, "layout: missing 'mesh'"),
        ({"format": "x/1", "mesh": [2]}, "layout: format 'x/1' is not 'tenplex.dtensor-layout/1'"),
        ({"mesh": [2, 0]}, "layout: mesh shape [2, 0] must be one or more positive integers"),
        ({"mesh": [2], "placements": {"w": ["S(0)", "R"]}}, "layout: layout placements['w'] = ['S(0)', 'R'] need one entry per mesh dim of [2]"),
        ({"mesh": [2], "placements": {"w": ["P"]}}, "layout: placement 'P' is not Shard(d)"),
        ({"mesh": [2], "placements": {"w": "S(0)"}}, "layout: placements must map FQNs or patterns to lists"),
        ("{not json", "layout: not JSON"),
    ],
)
def test_layout_errors(doc, message):
    with pytest.raises(PlacementError) as info:
        MeshLayout.from_json(doc if isinstance(doc, str) else json.dumps(doc))
    assert message in str(info.value)


def test_layout_entry_must_name_and_fit_a_tensor():
    src, _, _ = sharded_state()
    with pytest.raises(PlacementError, match=r"layout names \['model\.x'\], which the source checkpoint has no tensor for"):
        dst_ptc(src, MeshLayout((2,), {"model.x": ["S(0)"]}))
    with pytest.raises(PlacementError, match=r"layout placements\['model\.b'\] = \['S\(1\)'\] do not fit tensor 'model\.b' of shape \[3\]"):
        dst_ptc(src, MeshLayout((2,), {"model.b": ["S(1)"]}))


def _load_rank(path, layout, rank):
    """What DCP's own loader gives rank `rank` of `layout`: local chunks loaded as plain tensors
    at their offsets (one process plays each rank)."""
    src, _, _ = sharded_state()
    dst = dst_ptc(src, layout)
    out = {}
    for st in dst.partition_map[f"rank{rank}"].subtensors:
        sub = dst.subtensor_map[st]
        full = torch.zeros(dst.tensor_map[sub.tensor].shape, dtype=getattr(torch, GLOBAL[sub.tensor][0].dtype.name))
        out[sub.tensor] = (full, sub)
    sd = {k: v[0] for k, v in out.items()}
    sd.update(dict.fromkeys(VALUES))
    dcp.load(sd, checkpoint_id=str(path), no_dist=True)
    return {k: to_numpy(v[0])[v[1].pieces[0].global_box.to_slices()] if v[1].pieces else None for k, v in out.items()}, sd


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=[pytest.mark.multiprocess, pytest.mark.slow])])
def test_reshard_dcp_output_loads_in_dcp(src_dir, tmp_path, workers):
    if workers > 1:
        pytest.importorskip("ucxx")
    layout = {"mesh": [3], "placements": {"model.w": ["S(1)"]}}
    result = reshard_dcp(src_dir, layout, tmp_path / "b", workers=workers)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    assert set(result.seconds) == {"read", "compile", "execute", "write"}
    ml = MeshLayout.from_json(layout)
    for rank, coord in enumerate(coordinates((3,))):
        got, sd = _load_rank(tmp_path / "b", ml, rank)
        for fqn, (a, _) in GLOBAL.items():
            placements = ml.placements_for(sharded_state()[0].tensor_map[fqn], source_placements(sharded_state()[0], fqn, 1))
            want = a[local_box(a.shape, (3,), placements, coord).to_slices()]
            assert (got[fqn].tobytes() if got[fqn] is not None else b"") == want.tobytes(), (fqn, rank)
        assert sd["step"] == 7 and sd["optim.param_groups.0.betas"] == (0.9, 0.99)
    ptc, _, _ = read_dcp(tmp_path / "b")
    assert [t.name for t in ptc.tensors] == sorted(GLOBAL)


def test_reshard_dcp_leaves_nothing_on_error(src_dir, tmp_path, monkeypatch):
    with pytest.raises(PlacementError, match="layout names"):
        reshard_dcp(src_dir, {"mesh": [2], "placements": {"nope": ["R"]}}, tmp_path / "b")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(dcp_write, "_save", fail)
    with pytest.raises(DcpError, match=r"b: cannot write: disk full"):  # one line naming OUT_DIR, not an OSError
        reshard_dcp(src_dir, {"mesh": [2]}, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    with pytest.raises(DcpError, match=r"a: already exists \(refusing to overwrite\)"):
        reshard_dcp(src_dir, {"mesh": [2]}, src_dir)


def test_inspect_dcp_findings(src_dir):
    lines = inspect_dcp(src_dir)
    assert lines[0].endswith("4 data files, 6 tensors (192 B of tensor data), 4 bytes entries (non-tensor values)")
    assert "tensor model.w: float32[7, 5], 4 chunk(s) in 4 file(s), cut along dim(s) [0, 1]" in lines
    assert "tensor model.e: bfloat16[6], 4 chunk(s) in 4 file(s), cut along dim(s) [0]" in lines
    assert "tensor model.tiny: float32[3], 3 chunk(s) in 3 file(s), cut along dim(s) [0]" in lines
    assert lines[-1] == "all data files are present and long enough for their entries"


def test_inspect_dcp_raises_when_unreadable(src_dir):
    """A checkpoint that cannot be read is an error (the CLI exits 2), naming every bad file."""
    (src_dir / "__1_0.distcp").write_bytes(b"")
    (src_dir / "__2_0.distcp").unlink()
    with pytest.raises(DcpError, match=r"2 data file\(s\) cannot be read: .*__1_0\.distcp: truncated: has 0 bytes.*; .*__2_0\.distcp: missing"):
        inspect_dcp(src_dir)
    (src_dir / ".metadata").unlink()
    with pytest.raises(DcpError, match=re.escape(f"{src_dir / '.metadata'}: missing (not a DCP checkpoint directory)")):
        inspect_dcp(src_dir)


def test_local_shard_is_picklable():
    import pickle

    s = LocalShard.on_mesh(np.arange(3.0), (5,), (2,), [S(0)], 0)
    t = pickle.loads(pickle.dumps(s))
    assert t.spec("w") == s.spec("w") and t.array.tolist() == [0.0, 1.0, 2.0]
