"""DTensor state dicts ↔ PTC without processes: `ptc_from_specs`, `ptc_from_state_dicts` from
per-rank `LocalShard`s, resharding to another layout in-process against a numpy oracle,
`state_dicts_from_arrays`, and one test per error message."""

import ml_dtypes
import numpy as np
import pytest

from tenplex.frameworks.dcp.reshard import reshard_arrays
from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate, Shard, coordinates, local_box
from tenplex.frameworks.dtensor.layout import LocalShard, TensorSpec, ptc_from_specs
from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc
from tenplex.ir.tensor import TensorMeta

torch = pytest.importorskip("torch")
dtensor = pytest.importorskip("tenplex.frameworks.dtensor.state")
dtensor_torch = pytest.importorskip("tenplex.frameworks.dtensor.convert")

S, R = Shard, Replicate
# fqn: (global array, mesh, placements)
GLOBAL = {
    "model.w": (np.arange(35, dtype=np.float32).reshape(7, 5), (2, 2), [S(0), S(1)]),
    "model.b": (np.arange(100, 103, dtype=np.int64), (2, 2), [R(), S(0)]),  # 3 over 2 -> [2, 1]
    "model.e": (np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16), (2, 2), [S(0), S(0)]),  # 6 over 4 -> [2,2,2,0]
    "optim.state.w.step": (np.array(3.0, dtype=np.float32), (2, 2), [R(), R()]),
}


def rank_states(world=4, values=None):
    """One flat torch-free state dict per rank, cut from GLOBAL."""
    out = []
    for r, coord in enumerate(coordinates((2, 2))):
        flat = {}
        for fqn, (a, mesh, placements) in GLOBAL.items():
            box = local_box(a.shape, mesh, placements, coord)
            flat[fqn] = LocalShard.on_mesh(a[box.to_slices()].copy(), a.shape, mesh, placements, r)
        flat.update(values or {"step": 7, "optim.param_groups.0.betas": (0.9, 0.99)})
        out.append(flat)
    assert len(out) == world
    return out


def test_ptc_from_specs_one_partition_per_rank_and_empty_shards():
    spec = TensorSpec(TensorMeta("e", (6,), "float32"), (4,), [S(0)])
    ptc = ptc_from_specs(4, [spec], ["step"])
    assert [p.id for p in ptc.partitions] == ["rank0", "rank1", "rank2", "rank3"]
    assert [ptc.subtensor_map[f"e@rank{r}"].shape for r in range(4)] == [(2,), (2,), (2,), (0,)]
    assert ptc.subtensor_map["e@rank3"].pieces == ()
    assert ptc.uncovered() == {}
    assert all(p.value_map.keys() == {"step"} for p in ptc.partitions)


def test_sub_mesh_ranks_hold_nothing_outside_their_mesh():
    spec = TensorSpec(TensorMeta("w", (4,), "float32"), (2,), [S(0)], mesh_ranks=(1, 3))
    ptc = ptc_from_specs(4, [spec])
    assert sorted(st.id for st in ptc.subtensors) == ["w@rank1", "w@rank3"]
    assert ptc.partition_map["rank0"].subtensors == ()


def test_state_dicts_roundtrip_through_a_new_layout():
    src, arrays, values = dtensor.ptc_from_state_dicts(rank_states())
    assert arrays["model.w@rank3"].tolist() == GLOBAL["model.w"][0][4:, 3:].tolist()
    layout = MeshLayout((3,), {"model.w": ["S(1)"], "model.e": ["R"]})
    dst = dst_ptc(src, layout)
    got, got_values, _ = reshard_arrays(src, arrays, values, dst)
    sds = dtensor.state_dicts_from_arrays(dst, got, got_values)
    assert sorted(sds) == [0, 1, 2]
    for r, coord in enumerate(coordinates((3,))):
        for fqn, (a, _, _) in GLOBAL.items():
            placements = layout.placements_for(src.tensor_map[fqn], [S(0)] if fqn == "model.b" else [R()])
            want = a[local_box(a.shape, (3,), placements, coord).to_slices()]
            t = sds[r][fqn]
            assert isinstance(t, torch.Tensor) and dtensor_torch.to_numpy(t).tobytes() == want.tobytes(), (fqn, r)
        assert sds[r]["step"] == 7 and sds[r]["optim.param_groups.0.betas"] == (0.9, 0.99)


def test_state_dicts_nest_by_the_dcp_mapping():
    nested = {"model": {"0.weight": torch.arange(6.0)}, "optim": {"param_groups": [{"lr": 0.1, "params": ["0.weight"]}]}}
    flat, mapping = dtensor.flatten(nested)
    assert sorted(flat) == ["model.0.weight", "optim.param_groups.0.lr", "optim.param_groups.0.params"]
    src, arrays, values = dtensor.ptc_from_state_dicts([nested, nested])
    back = dtensor.state_dicts_from_arrays(src, arrays, values, mapping)
    assert back[1]["optim"]["param_groups"][0] == {"lr": 0.1, "params": ["0.weight"]}
    assert back[1]["model"]["0.weight"].tolist() == list(range(6))


def test_placement_from_torch_rejects_strided_and_partial():
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.placement_types import _StridedShard

    with pytest.raises(PlacementError, match=r"m\.w: placement .*_StridedShard, FSDP2\+TP"):
        dtensor_torch.placement_from_torch(_StridedShard(0, split_factor=2), "m.w")
    with pytest.raises(PlacementError, match=r"m\.w: placement .*\(Partial\) is not Shard or Replicate"):
        dtensor_torch.placement_from_torch(Partial(), "m.w")
    assert dtensor_torch.placement_from_torch(torch.distributed.tensor.Shard(1), "m.w") == S(1)


def test_bfloat16_arrays_share_memory_with_tensors():
    a = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = dtensor_torch.from_numpy(a)
    assert t.dtype == torch.bfloat16 and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert dtensor_torch.to_numpy(t).tobytes() == a.tobytes()


def _with(rank: int, fqn: str, leaf):
    states = rank_states()
    states[rank][fqn] = leaf
    return states


@pytest.mark.parametrize(
    "states, message",
    [
        (lambda: _with(2, "model.w", LocalShard.on_mesh(np.zeros((2, 5), np.float32), (7, 5), (4,), [S(0)], 2)),
         "model.w: rank 2 has layout float32[7, 5] on mesh [4] ['S(0)'] ranks [0, 1, 2, 3] but rank 0 has float32[7, 5] on mesh [2, 2] ['S(0)', 'S(1)']"),
        (lambda: _with(1, "step", 8), "step: rank 1 holds 8 but rank 0 holds 7; values must agree across ranks"),
        (lambda: [dict(sd, plain=np.ones(2) if r == 1 else np.zeros(2)) for r, sd in enumerate(rank_states())],
         "plain: plain tensor differs between rank 0 and rank 1; DCP would keep one copy and lose the other"),
        (lambda: [rank_states()[0], {}, *rank_states()[2:]], "rank 1 and rank 0 hold different FQNs"),
        (lambda: [rank_states()[1], rank_states()[0], *rank_states()[2:]], "model.b: the state dict at position 0 holds rank 1's shard"),
        (lambda: [], "no state dicts: need one per rank"),
    ],
)  # fmt: skip
def test_state_dict_errors(states, message):
    with pytest.raises(PlacementError) as info:
        dtensor.ptc_from_state_dicts(states())
    assert message in str(info.value)


def test_local_shard_shape_error():
    with pytest.raises(PlacementError, match=r"rank 3: local array of shape \(2,\) but placements \['S\(0\)'\] on mesh \[4\] give \(0,\)"):
        LocalShard.on_mesh(np.zeros(2), (6,), (4,), [S(0)], 3)


def test_mesh_ranks_error():
    with pytest.raises(PlacementError, match=r"tensor 'w': mesh ranks \[0, 0\] are not 2 distinct ranks of mesh shape \[2\]"):
        TensorSpec(TensorMeta("w", (4,), "float32"), (2,), [S(0)], mesh_ranks=(0, 0))
    with pytest.raises(PlacementError, match=r"tensor 'w': mesh ranks \[0, 5\] exceed world size 4"):
        ptc_from_specs(4, [TensorSpec(TensorMeta("w", (4,), "float32"), (2,), [S(0)], mesh_ranks=(0, 5))])
    with pytest.raises(PlacementError, match=r"state dict names \['w'\] are used twice"):
        ptc_from_specs(2, [TensorSpec(TensorMeta("w", (4,), "float32"), (2,), [S(0)])], ["w"])


def _outside_rank():
    shard = LocalShard.on_mesh(np.zeros(2), (4,), (2,), [S(0)], 0)
    return [{"w": shard}, {"w": LocalShard(np.zeros(2), (4,), "float64", (2,), (S(0),), (0, 1), 1)}, {"w": LocalShard(None, (4,), "float64", (2,), (S(0),), (0, 1), 2)}]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ptc_from_specs(0, []), "world size 0 must be a positive integer"),
        (lambda: dtensor.state_dicts_from_arrays(ptc_from_specs(1, [TensorSpec(TensorMeta("w", (2,), "float32"), (1,), [R()])]), {}, {}),
         "rank 0: no array for sub-tensor 'w@rank0'"),
        (lambda: dtensor.state_dicts_from_arrays(sharded_ptc_with_partition("__0_0"), {}, {}), "partition '__0_0' is not a DTensor rank partition 'rank<r>'"),
        (lambda: LocalShard(np.zeros(2), (4,), "float64", (2,), (S(0),), (0, 1), 5), "rank 5 holds an array but is not in mesh ranks [0, 1]"),
        (lambda: dtensor.ptc_from_state_dicts([{"w": LocalShard(None, (4,), "float64", (2,), (S(0),), (0, 1), 0)}, _outside_rank()[1]]),
         "w: rank 0 lacks a local tensor but is in mesh ranks [0, 1]"),
        (lambda: dtensor_torch.dtype_name(torch.complex32), "torch dtype torch.complex32 has no tenplex dtype"),
    ],
)  # fmt: skip
def test_layout_errors_name_the_values(call, message):
    with pytest.raises(PlacementError) as info:
        call()
    assert message in str(info.value)


def sharded_ptc_with_partition(pid):
    from tenplex.ir import PTC, Allocation, Device, Partition, Topology

    return PTC((), (), (Partition(pid, ()),), Allocation({pid: (0,)}), Topology((Device(0, "h0"),)))


def test_ranks_outside_a_sub_mesh_hold_nothing():
    ptc, arrays, _ = dtensor.ptc_from_state_dicts(_outside_rank())
    assert sorted(arrays) == ["w@rank0", "w@rank1"] and ptc.partition_map["rank2"].subtensors == ()
