"""`load_dcp` (tenplex as DCP's loader) and `dcp.apply` in one process: equal to DCP's own
loader, shards of any rank filled in place, errors; plan application picks a forward-free
replica and says so when there is none."""

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.compiler import CopyOp, compile_plan  # noqa: E402
from tenplex.frameworks.dcp.apply import StreamedArrays  # noqa: E402
from tenplex.frameworks.dcp.load import load_dcp  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate, Shard, coordinates, local_box  # noqa: E402
from tenplex.frameworks.dtensor.convert import to_numpy  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard  # noqa: E402
from tenplex.ir import PTC, Allocation, Box, Device, ExecutionError, Partition, Piece, SubTensor, TensorMeta, Topology  # noqa: E402
from tenplex.runtime.checkpoint.apply import ops_by_dst  # noqa: E402
from tests.frameworks.test_dcp_files import GLOBAL, VALUES, sharded_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
S, R = Shard, Replicate


@pytest.fixture
def src_dir(tmp_path):
    write_dcp(*sharded_state(), tmp_path / "a")
    return tmp_path / "a"


def _full_state():
    sd = {f: torch.zeros(a.shape, dtype=getattr(torch, a.dtype.name)) for f, (a, _) in GLOBAL.items()}
    return {**sd, **dict.fromkeys(VALUES)}


def test_load_dcp_equals_dcp_load_into_full_tensors(src_dir):
    ours, theirs = _full_state(), _full_state()
    load_dcp(ours, src_dir)
    dcp.load(theirs, checkpoint_id=str(src_dir), no_dist=True)
    for fqn in GLOBAL:
        assert to_numpy(ours[fqn]).tobytes() == to_numpy(theirs[fqn]).tobytes() == GLOBAL[fqn][0].tobytes(), fqn
    for name in ("step", "optim.param_groups.0.betas", "name"):
        assert ours[name] == theirs[name]
    assert np.isnan(ours["nan"])


def test_load_dcp_fills_each_ranks_shards_in_place(src_dir):
    for rank, coord in enumerate(coordinates((3,))):
        state = {}
        for fqn, (a, _) in GLOBAL.items():
            placements = [S(1) if a.ndim == 2 else S(0) if a.ndim else R()]
            box = local_box(a.shape, (3,), placements, coord)
            state[fqn] = LocalShard.on_mesh(np.zeros(box.shape, a.dtype), a.shape, (3,), placements, rank)
        load_dcp(state, src_dir, rank=rank)
        for fqn, (a, _) in GLOBAL.items():
            want = a[state[fqn].spec(fqn).box_of_rank(rank).to_slices()]
            assert state[fqn].array.tobytes() == want.tobytes(), (fqn, rank)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda sd: sd.update({"model.w": torch.zeros(5, 7)}), "model.w: the state dict holds float32[5, 7] but the checkpoint has float32[7, 5]"),
        (lambda sd: sd.update({"model.b": torch.zeros(3)}), "model.b: the state dict holds float32[3] but the checkpoint has int64[3]"),
        (lambda sd: sd.update({"model.x": torch.zeros(3)}), "model.x: the state dict holds float32[3] but the checkpoint has nothing"),
        (lambda sd: sd.update({"epoch": 3}), "epoch: the checkpoint has no value for this key"),
    ],
)
def test_load_dcp_errors(src_dir, edit, message):
    sd = _full_state()
    edit(sd)
    with pytest.raises(PlacementError) as info:
        load_dcp(sd, src_dir)
    assert message in str(info.value)


def _replicated_dst():
    """src on host h0; dst replicated on devices (2, 1) of host h1: device 1 receives, 2 is forwarded to."""
    t = TensorMeta("w", (8,), "float32")
    topo = Topology((Device(0, "h0"), Device(1, "h1"), Device(2, "h1")))
    whole = (Piece(Box((0,), (8,)), Box((0,), (8,))),)
    src = PTC((t,), (SubTensor("w/s", "w", "w", (8,), whole),), (Partition("s", ("w/s",)),), Allocation({"s": (0,)}), topo)
    dst = PTC((t,), (SubTensor("w/d", "w", "w", (8,), whole),), (Partition("d", ("w/d",)),), Allocation({"d": (2, 1)}), topo)
    return src, dst


def test_streamed_arrays_use_a_forward_free_replica():
    src, dst = _replicated_dst()
    plan = compile_plan(src, dst)
    assert any(op.src_side == "dst" for op in plan.ops if isinstance(op, CopyOp))
    streamed = StreamedArrays(plan, src, dst, {("w/s", 0): np.arange(8, dtype=np.float32)})
    assert streamed["w/d"].tolist() == list(range(8)) and list(streamed) == ["w/d"] and len(streamed) == 1


def test_ops_by_dst_refuses_when_every_instance_is_forwarded():
    src, dst = _replicated_dst()
    plan = compile_plan(src, dst)
    forwards = [op for op in plan.ops if isinstance(op, CopyOp) and op.src_side == "dst"]
    fake = types.SimpleNamespace(ops=tuple(forwards) + tuple(CopyOp(**{**vars_of(f), "dst_device": 1, "src_device": 2}) for f in forwards),
                                 allocation=plan.allocation)  # fmt: skip
    with pytest.raises(ExecutionError, match=r"every instance of dst sub-tensor 'w/d' \(devices \[2, 1\]\) reads forwarded dst state"):
        ops_by_dst(fake, dst)


def vars_of(op):
    import attrs

    return attrs.asdict(op, recurse=False)
