"""DCP directories in one process: tenplex's writer read back by DCP's own loader (no_dist),
DCP's own single-process save read by tenplex, read(write(x)) == x, bytes entries, and one
test per error (each names the file and the key)."""

import pickle
import shutil

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp, read_index  # noqa: E402
from tenplex.frameworks.dcp.write import plan_chunks, write_dcp  # noqa: E402
from tenplex.frameworks.dtensor.boxes import Replicate, Shard, coordinates, local_box  # noqa: E402
from tenplex.frameworks.dtensor.convert import to_numpy  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard  # noqa: E402
from tenplex.frameworks.dtensor.state import ptc_from_state_dicts  # noqa: E402
from tenplex.frameworks.dtensor.values import is_opaque, python_value  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
S, R = Shard, Replicate
GLOBAL = {
    "model.w": (np.arange(35, dtype=np.float32).reshape(7, 5), [S(0), S(1)]),
    "model.e": (np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16), [S(0), S(0)]),  # 6 -> [3, 3] -> [2, 1, 2, 1]
    "model.tiny": (np.arange(3, dtype=np.float32), [S(0), S(0)]),  # 3 -> [2, 1] -> [1, 1, 1, 0]: an empty shard
    "model.b": (np.arange(100, 103, dtype=np.int64), [R(), S(0)]),
    "optim.state.w.step": (np.array(3.0, dtype=np.float32), [R(), R()]),
    "zero": (np.zeros((0, 4), dtype=np.float32), [S(0), R()]),
}
VALUES = {"step": 7, "optim.param_groups.0.betas": (0.9, 0.99), "name": "run-1", "nan": float("nan")}


def sharded_state():
    """The PTC triple of GLOBAL on a 2x2 mesh (4 ranks, partition per rank)."""
    states = []
    for r, coord in enumerate(coordinates((2, 2))):
        flat = {f: LocalShard.on_mesh(a[local_box(a.shape, (2, 2), p, coord).to_slices()].copy(), a.shape, (2, 2), p, r)
                for f, (a, p) in GLOBAL.items()}  # fmt: skip
        states.append({**flat, **VALUES})
    return ptc_from_state_dicts(states)


@pytest.fixture
def written(tmp_path):
    ptc, arrays, values = sharded_state()
    write_dcp(ptc, arrays, values, tmp_path / "ck")
    return tmp_path / "ck"


def _load_full(path, names):
    """DCP's own loader (single process) into full plain tensors and value placeholders."""
    sd = {f: torch.zeros(GLOBAL[f][0].shape, dtype=getattr(torch, GLOBAL[f][0].dtype.name)) for f in names}
    sd.update(dict.fromkeys(VALUES))
    dcp.load(sd, checkpoint_id=str(path), no_dist=True)
    return sd


def test_dcp_loads_what_tenplex_writes(written):
    sd = _load_full(written, GLOBAL)
    for fqn, (a, _) in GLOBAL.items():
        assert to_numpy(sd[fqn]).tobytes() == a.tobytes(), fqn
    assert sd["step"] == 7 and sd["optim.param_groups.0.betas"] == (0.9, 0.99) and sd["name"] == "run-1"
    assert np.isnan(sd["nan"])
    assert sorted(p.name for p in written.iterdir()) == [".metadata"] + [f"__{i}_0.distcp" for i in range(4)]


def test_replicas_written_once_empty_tensor_listed(written):
    ptc, _, _ = sharded_state()
    chunks = plan_chunks(ptc)
    boxes = [box for cs in chunks.values() for name, _, _, box in cs if name == "model.b"]
    assert sorted(b.to_list() for b in boxes) == [[[0, 2]], [[2, 3]]]  # R on mesh dim 0: once
    index = read_index(written)
    assert [e.box.shape for e in index.entries if e.fqn == "zero"] == [(0, 4)]


@pytest.mark.parametrize("mmap", [True, False])
def test_read_write_roundtrip(written, tmp_path, mmap):
    ptc, arrays, values = read_dcp(written, mmap=mmap)
    assert all(a.flags.writeable != mmap for a in arrays.values() if a.size)
    assert [p.id for p in ptc.partitions] == ["__0_0", "__1_0", "__2_0", "__3_0"]
    assert values["__0_0"]["step"] == 7 and values["__0_0"]["name"] == "run-1"
    betas = values["__0_0"]["optim.param_groups.0.betas"]
    assert is_opaque(betas) and betas["type"] == "tuple" and python_value(betas) == (0.9, 0.99)
    assert is_opaque(values["__0_0"]["nan"])  # NaN is not JSON
    write_dcp(ptc, arrays, values, tmp_path / "again")
    ptc2, arrays2, values2 = read_dcp(tmp_path / "again")
    assert ptc2 == ptc and values2 == values
    assert all(arrays2[k].tobytes() == a.tobytes() for k, a in arrays.items())
    for name in ("__0_0.distcp", "__3_0.distcp"):
        assert (written / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_tenplex_reads_dcp_single_process_save(tmp_path):
    state = {"model": {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, "step": 5, "ids": [1, 2]}
    dcp.save(state, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    ptc, arrays, values = read_dcp(tmp_path / "ck")
    assert [t.name for t in ptc.tensors] == ["model.w"]
    assert arrays["model.w@[0,0]"].tolist() == state["model"]["w"].tolist()
    assert values == {"__0_0": {"ids": [1, 2], "step": 5}}
    assert read_index(tmp_path / "ck").mapping["model.w"] == ("model", "w")


def _edit_metadata(path, edit):
    md = pickle.loads((path / ".metadata").read_bytes())
    edit(md)
    (path / ".metadata").write_bytes(pickle.dumps(md))


def _drop_chunk(md):
    md.state_dict_metadata["model.w"].chunks.pop()


def _overlap(md):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    chunks = md.state_dict_metadata["model.w"].chunks
    chunks.append(type(chunks[0])(offsets=torch.Size([1, 1]), sizes=torch.Size([1, 1])))
    md.storage_data[MetadataIndex("model.w", [1, 1])] = md.storage_data[MetadataIndex("model.w", [0, 0])]


def _no_storage(md):
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != "model.b"}


def _outside(md):
    md.state_dict_metadata["model.w"].chunks[0].sizes = torch.Size([9, 3])


def _dtype(md):
    md.state_dict_metadata["model.b"].properties.dtype = torch.float64


def _transform(md):
    for v in md.storage_data.values():
        v.transform_descriptors = ["zstd"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / ".metadata").unlink(), r"\.metadata: missing \(not a DCP checkpoint directory\)"),
        (lambda p: (p / ".metadata").write_bytes(b"junk"), r"\.metadata: not a readable DCP metadata file"),
        (lambda p: (p / "__1_0.distcp").unlink(), r"__1_0\.distcp: missing \(holds "),
        (lambda p: (p / "__2_0.distcp").write_bytes((p / "__2_0.distcp").read_bytes()[:100]),
         r"__2_0\.distcp: truncated: model\.\w+@\[[\d,]*\] needs bytes \[\d+, \d+\) but the file has 100"),
        (lambda p: (p / "__0_0.distcp").write_bytes(b"\0" * (p / "__0_0.distcp").stat().st_size),
         r"__0_0\.distcp: \S+@\[[\d,]*\] at bytes \[\d+, \d+\) is not a saved tensor"),
        (lambda p: _edit_metadata(p, _drop_chunk), r"\.metadata: tensor 'model\.w' region \[\[4, 7\], \[3, 5\]\] is in no saved chunk"),
        (lambda p: _edit_metadata(p, _overlap), r"\.metadata: tensor 'model\.w' chunks .* overlap"),
        (lambda p: _edit_metadata(p, _no_storage), r"\.metadata: storage_data has no entry for model\.b chunk at offsets \[0\]"),
        (lambda p: _edit_metadata(p, _transform), r"uses stream transform 'zstd', which tenplex does not read \(it reads stream.zstd/1\)"),
        (lambda p: _edit_metadata(p, _outside), r"tensor 'model\.w' chunk 0 at offsets \[0, 0\] sizes \[9, 3\] is outside its size \[7, 5\]"),
        (lambda p: _edit_metadata(p, _dtype), r"__\d_0\.distcp: model\.b@\[\d\] at bytes \[\d+, \d+\) holds torch\.int64\[\d\], expected float64\[\d\]"),
    ],
)  # fmt: skip
def test_read_errors_name_file_and_key(written, damage, message):
    damage(written)
    with pytest.raises(DcpError, match=message):
        read_dcp(written)


def test_write_refuses_existing_dir_and_leaves_nothing_on_error(tmp_path, written):
    ptc, arrays, values = sharded_state()
    with pytest.raises(DcpError, match=r"ck: already exists \(refusing to overwrite\)"):
        write_dcp(ptc, arrays, values, written)
    bad = dict(arrays, **{"model.w@rank1": np.zeros((4, 4), np.float32)})
    with pytest.raises(DcpError, match=r"sub-tensor 'model\.w@rank1': array is float32\[4, 4\], expected float32\[4, 2\]"):
        write_dcp(ptc, bad, values, tmp_path / "out")
    with pytest.raises(DcpError, match=r"partition 'rank0': no value for 'name'"):
        write_dcp(ptc, arrays, {"rank0": {"step": 7}}, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_write_refuses_incomplete_ptc(tmp_path):
    ptc, arrays, values = sharded_state()
    part = ptc.partition_map["rank3"]
    import attrs

    from tenplex.ir.ptc import PTC

    keep = [s for s in ptc.subtensors if s.id != "model.w@rank3"]
    parts = [attrs.evolve(p, subtensors=[s for s in p.subtensors if s != "model.w@rank3"]) if p is part else p for p in ptc.partitions]
    holey = PTC(ptc.tensors, keep, parts, ptc.allocation, ptc.topology)
    with pytest.raises(DcpError, match=r"tensor 'model\.w' region \[\[4, 7\], \[3, 5\]\] is held by no sub-tensor"):
        write_dcp(holey, arrays, values, tmp_path / "out")
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
