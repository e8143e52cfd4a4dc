"""tenplex's own `torch.save` records (`dcp.record`) and the `.distcp` files `write_dcp` builds
from them, checked against torch itself: each record is byte-identical to `torch.save`'s and
`torch.load(weights_only=True)` gives the array back; each file of a whole checkpoint (every
tenplex dtype, empty shards, a 0-dim tensor, bytes entries) is byte-identical to the file DCP's
own `FileSystemWriter` writes for the same plan, and DCP's loader restores every tensor."""

import io
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.frameworks.dcp import record, write  # noqa: E402
from tenplex.frameworks.dtensor.boxes import Replicate, Shard, coordinates, local_box  # noqa: E402
from tenplex.frameworks.dtensor.convert import from_numpy, to_numpy  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard  # noqa: E402
from tenplex.frameworks.dtensor.state import ptc_from_state_dicts  # noqa: E402
from tenplex.ir.tensor import ITEMSIZE  # noqa: E402
from tenplex.runtime.arrays import np_dtype  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    n = int(np.prod(shape)) * ITEMSIZE[dtype]
    raw = np.random.default_rng(seed).integers(0, 2 if dtype == "bool" else 256, n, dtype=np.uint8)
    return raw.view(np_dtype(dtype)).reshape(shape)


def _torch_save(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    torch.save(from_numpy(array), buf)
    return buf.getvalue()


shapes = st.one_of(st.lists(st.integers(0, 4), max_size=4), st.sampled_from([[300], [2, 70000], [1, 1, 1, 1, 1]])).map(tuple)


@given(dtype=st.sampled_from(sorted(ITEMSIZE)), shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_record_is_torch_saves_bytes_and_loads_back(dtype, shape, seed):
    a = _array(dtype, shape, seed)
    got = b"".join(bytes(p) for p in record.tensor_record(a, dtype))
    assert got == _torch_save(a)
    back = torch.load(io.BytesIO(got), weights_only=True)
    assert str(back.dtype) == f"torch.{dtype}" and tuple(back.shape) == shape
    assert to_numpy(back).tobytes() == a.tobytes()


@given(sizes=st.lists(st.integers(0, 20000), min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs_with_and_without_libdeflate(sizes, seed):
    import zlib

    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    want = zlib.crc32(b"".join(p.tobytes() for p in parts))
    lookup = record.libdeflate_crc32
    try:
        for deflate in (lookup(), None):
            record.libdeflate_crc32 = lambda deflate=deflate: deflate
            crc = 0
            for p in parts:
                crc = record.crc32(p, crc)
            assert crc == want
    finally:
        record.libdeflate_crc32 = lookup


def test_record_refuses_what_it_cannot_write(monkeypatch):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        record.tensor_record(a[:, ::2])
    with pytest.raises(ValueError, match=r"dtype float32 as 'bfloat16'"):
        record.tensor_record(a, "bfloat16")
    assert record.fits(record.MAX_DATA) and not record.fits(record.MAX_DATA + 1)
    monkeypatch.setattr(record, "MAX_DATA", 16)
    with pytest.raises(ValueError, match="48 bytes need zip64 fields"):
        record.tensor_record(a)


# ---- whole checkpoints: every dtype, against DCP's own writer --------------------------------
MESH = (2, 2)
DTYPES = sorted(ITEMSIZE)


def _global() -> dict[str, tuple[np.ndarray, list]]:
    out = {f"t.{d}": (_array(d, (5, 3), i), [Shard(0), Shard(1)]) for i, d in enumerate(DTYPES)}
    out["t.tiny"] = (_array("bfloat16", (3,), 99), [Shard(0), Shard(0)])  # [1, 1, 1, 0]: an empty shard
    out["t.scalar"] = (_array("float8_e5m2", (), 98), [Replicate(), Replicate()])
    out["t.none"] = (np.zeros((0, 4), np.float32), [Shard(0), Replicate()])
    return out


def _state():
    full = _global()
    states = []
    for r, coord in enumerate(coordinates(MESH)):
        flat = {f: LocalShard.on_mesh(a[local_box(a.shape, MESH, p, coord).to_slices()].copy(), a.shape, MESH, p, r)
                for f, (a, p) in full.items()}  # fmt: skip
        states.append({**flat, "step": 7, "betas": (0.9, 0.99)})
    return full, ptc_from_state_dicts(states)


class _TorchPlanner(dcp.SavePlanner):
    """DCP's writer resolving `write_dcp`'s plans to torch tensors: the reference files."""

    def __init__(self, data):
        self.data = data

    def set_up_planner(self, *args, **kwargs):
        pass

    def create_local_plan(self):
        raise NotImplementedError

    def create_global_plan(self, all_plans):
        raise NotImplementedError

    def finish_plan(self, new_plan):
        return new_plan

    def resolve_data(self, item):
        got = self.data[item.index]
        if isinstance(got, bytes):
            return io.BytesIO(got)
        parts, dtype, shape = got()
        t = from_numpy(np.concatenate([p.reshape(-1).view(np.uint8) for p in parts]).view(np_dtype(dtype)).reshape(shape))
        # an empty view's strides are arbitrary (numpy's); records carry torch's own for no bytes
        return t if t.numel() else torch.empty(t.shape, dtype=t.dtype)


def _reference(ptc, arrays, values, out):
    from torch.distributed.checkpoint.default_planner import create_default_global_save_plan

    plans, data = write._plans(ptc, arrays, values)
    writer = dcp.FileSystemWriter(out, single_file_per_rank=True, sync_files=False, per_thread_copy_ahead=0)
    writer.set_up_storage_writer(True, rank=0, use_collectives=True)
    plans, md = create_default_global_save_plan([writer.prepare_local_plan(p) for p in plans])
    planner = _TorchPlanner(data)
    results = [writer.write_data(p, planner).wait() for p in writer.prepare_global_plan(plans)]
    writer.finish(md, results)
    return md


@pytest.mark.parametrize("short_writes", [False, True])
def test_checkpoint_files_equal_dcps_own_and_load_in_dcp(tmp_path, monkeypatch, short_writes):
    full, (ptc, arrays, values) = _state()
    want = _reference(ptc, arrays, values, tmp_path / "torch")
    if short_writes:  # the kernel may write less than asked: the rest follows, in order
        real = os.writev
        monkeypatch.setattr(os, "writev", lambda fd, bufs: real(fd, [bytes(b"".join(bytes(b) for b in bufs)[:7])]))
    got = write.write_dcp(ptc, arrays, values, tmp_path / "ours")
    names = sorted(p.name for p in (tmp_path / "torch").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ours").iterdir()) == [".metadata"] + [f"__{i}_0.distcp" for i in range(4)]
    for name in names[1:]:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "torch" / name).read_bytes(), name
    assert got.storage_data == want.storage_data and got.state_dict_metadata == want.state_dict_metadata
    _assert_dcp_loads(tmp_path / "ours", full)


def _assert_dcp_loads(path, full):
    """DCP's own loader (one process) restores every tensor bit for bit, and the values."""
    sd = {f: torch.zeros(a.shape, dtype=getattr(torch, a.dtype.name)) for f, (a, _) in full.items()}
    sd.update(step=None, betas=None)
    dcp.load(sd, checkpoint_id=str(path), no_dist=True)
    for f, (a, _) in full.items():
        assert to_numpy(sd[f]).tobytes() == a.tobytes(), f
    assert sd["step"] == 7 and sd["betas"] == (0.9, 0.99)


def test_a_chunk_too_big_for_a_record_is_saved_by_torch(tmp_path, monkeypatch):
    full, (ptc, arrays, values) = _state()
    monkeypatch.setattr(record, "MAX_DATA", 8)  # every chunk over 8 bytes takes torch.save's path
    write.write_dcp(ptc, arrays, values, tmp_path / "ours")
    _reference(ptc, arrays, values, tmp_path / "torch")
    for i in range(4):
        assert (tmp_path / "ours" / f"__{i}_0.distcp").read_bytes() == (tmp_path / "torch" / f"__{i}_0.distcp").read_bytes()
    _assert_dcp_loads(tmp_path / "ours", full)


@pytest.mark.parametrize(("layout", "direct"), [({"mesh": [2]}, True), ({"mesh": [2], "placements": {"*": ["S(1)"]}}, False)])
def test_streamed_chunks_are_written_from_the_source_regions(tmp_path, layout, direct):
    """rows/4 -> rows/2: each dst chunk is two whole src chunks, written from them (`parts`);
    rows -> cols is produced first. Either way the files equal those of the produced arrays."""
    from tenplex.frameworks.dcp.read import read_dcp
    from tenplex.frameworks.dcp.reshard import reshard_arrays
    from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc

    a = _array("bfloat16", (8, 6), 5)
    mesh = (4,)
    states = [{"w": LocalShard.on_mesh(a[local_box(a.shape, mesh, [Shard(0)], c).to_slices()].copy(), a.shape, mesh, [Shard(0)], r)}
              for r, c in enumerate(coordinates(mesh))]  # fmt: skip
    write.write_dcp(*ptc_from_state_dicts(states), tmp_path / "src")
    src, arrays, values = read_dcp(tmp_path / "src")
    dst = dst_ptc(src, MeshLayout.from_json(layout))
    streamed, out_values, _ = reshard_arrays(src, arrays, values, dst, stream=True)
    for sid in streamed:
        parts = streamed.parts(sid)
        assert (parts is not None) == direct
        if direct:
            assert len(parts) == 2 and all(np.shares_memory(p, arrays[s]) for p, s in zip(parts, sorted(arrays)[2 * int(sid[-1]) :]))
            assert b"".join(p.tobytes() for p in parts) == streamed[sid].tobytes()
    write.write_dcp(dst, streamed, out_values, tmp_path / "streamed")
    write.write_dcp(dst, {sid: streamed[sid].copy() for sid in streamed}, out_values, tmp_path / "produced")
    for name in ("__0_0.distcp", "__1_0.distcp"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "produced" / name).read_bytes()
    _, back, _ = read_dcp(tmp_path / "streamed")
    assert np.concatenate([back[s] for s in sorted(back)], axis=0 if direct else 1).tobytes() == a.tobytes()
