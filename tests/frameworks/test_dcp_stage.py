"""`Stage(s)` in dst layouts (pipeline stages): parsing, round trip and one test per error; the
ranks and boxes `dst_specs` gives on [2, 1, 2] and [2, 2, 1] meshes; a property test against
torch.chunk; and a real DCP checkpoint resharded to pp=2, loaded rank by rank with `load_dcp`,
and resharded back to pp=1."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.frameworks.dcp.load import load_dcp  # noqa: E402
from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.dcp.reshard import reshard_dcp  # noqa: E402
from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate, Shard, coordinate_of, parse_placement  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard, TensorSpec, ptc_from_specs  # noqa: E402
from tenplex.frameworks.dtensor.mesh import FORMAT, MeshLayout, dst_ptc, dst_specs  # noqa: E402
from tenplex.frameworks.dtensor.stage import Stage, parse_layout_placement, stage_slice  # noqa: E402
from tenplex.ir.tensor import TensorMeta  # noqa: E402
from tests.strategies import shapes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
S, R = Shard, Replicate


# --- the format ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("Stage(0)", Stage(0)), ("Stage(12)", Stage(12)), (" Stage(1) ", Stage(1)), ("S(1)", S(1)), ("R", R())],
)
def test_parse_layout_placement(text, want):
    assert parse_layout_placement(text) == want
    assert parse_layout_placement(str(want)) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stage(1)", "placement 'stage(1)' is not Stage(s) with s an integer >= 0 (spelt exactly 'Stage(1)')"),
        ("STAGE(1)", "placement 'STAGE(1)' is not Stage(s) with s an integer >= 0"),
        ("Stage(-1)", "placement 'Stage(-1)' is not Stage(s) with s an integer >= 0"),
        ("Stage(x)", "placement 'Stage(x)' is not Stage(s) with s an integer >= 0"),
        ("Stage1", "placement 'Stage1' is not Stage(s) with s an integer >= 0"),
        ("P", "placement 'P' is not Shard(d) ('S(d)'), Replicate ('R') or Stage(s)"),
    ],
)
def test_parse_layout_placement_errors(text, message):
    with pytest.raises(PlacementError) as info:
        parse_layout_placement(text)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("index", [-1, True, 1.5, "1"])
def test_stage_index_must_be_a_non_negative_int(index):
    with pytest.raises(PlacementError, match=r"stage index .* is not an integer >= 0"):
        Stage(index)


def test_torch_side_placements_do_not_accept_stage():
    with pytest.raises(PlacementError, match=r"placement 'Stage\(0\)' is not Shard\(d\)"):
        parse_placement("Stage(0)")


def test_layout_with_stages_round_trips():
    doc = {"format": FORMAT, "mesh": [2, 1, 2],
           "placements": {"model.blocks.1.q.weight": ["Stage(1)", "R", "S(0)"], "model.x": ["Stage(1)", "Stage(0)", "Stage(1)"],
                          "model.blocks.0.*": ["Stage(0)", "R", "R"], "*": ["R", "R", "R"]}}  # fmt: skip
    layout = MeshLayout.from_json(json.dumps(doc))
    assert dict(layout.rules)["model.blocks.1.q.weight"] == (Stage(1), R(), S(0))
    assert layout.to_json() == doc and MeshLayout.from_json(layout.to_json()) == layout


@pytest.mark.parametrize(
    ("placements", "message"),
    [
        ({"model.w": ["Stage(2)", "R", "S(0)"]},
         "layout: layout placements['model.w'] = ['Stage(2)', 'R', 'S(0)']: Stage(2) is outside mesh dim 0 of size 2 (mesh [2, 1, 2])"),
        ({"model.blocks.*": ["R", "Stage(1)", "R"]},
         "layout: layout placements['model.blocks.*'] = ['R', 'Stage(1)', 'R']: Stage(1) is outside mesh dim 1 of size 1 (mesh [2, 1, 2])"),
        ({"model.w": ["Stage(0)", "R"]}, "layout: layout placements['model.w'] = ['Stage(0)', 'R'] need one entry per mesh dim of [2, 1, 2]"),
        ({"model.w": ["stage(0)", "R", "R"]}, "layout: placement 'stage(0)' is not Stage(s) with s an integer >= 0"),
    ],
)  # fmt: skip
def test_layout_stage_errors_name_the_entry_and_mesh(placements, message):
    with pytest.raises(PlacementError) as info:
        MeshLayout.from_json({"mesh": [2, 1, 2], "placements": placements})
    assert message in str(info.value)


# --- ranks and boxes ----------------------------------------------------------------------------

SRC_SHAPES = {"model.a": (4, 2), "model.b": (4, 5), "model.c": (3,), "model.step": (), "model.shared": (2, 2)}


def _src_ptc(shapes_by_name=SRC_SHAPES):
    """A torch-free one-rank source PTC holding each tensor whole."""
    specs = [TensorSpec(TensorMeta(n, s, "float32"), (1,), (R(),)) for n, s in shapes_by_name.items()]
    return ptc_from_specs(1, specs)


def _ranks_and_boxes(spec):
    return {r: box.to_list() for r, box in spec.boxes().items()}


def test_pp_mesh_2_1_2_ranks_and_boxes():
    layout = MeshLayout((2, 1, 2), {"model.a": ["Stage(1)", "R", "S(0)"], "model.b": ["Stage(0)", "R", "S(1)"],
                                    "model.c": ["Stage(1)", "R", "R"], "model.step": ["Stage(0)", "R", "R"],
                                    "model.shared": ["R", "R", "S(1)"]})  # fmt: skip
    specs = {s.name: s for s in dst_specs(_src_ptc(), layout)}
    assert specs["model.a"].mesh_shape == (1, 2) and specs["model.a"].placements == (R(), S(0)) and specs["model.a"].mesh_ranks == (2, 3)
    assert _ranks_and_boxes(specs["model.a"]) == {2: [[0, 2], [0, 2]], 3: [[2, 4], [0, 2]]}
    assert _ranks_and_boxes(specs["model.b"]) == {0: [[0, 4], [0, 3]], 1: [[0, 4], [3, 5]]}
    assert _ranks_and_boxes(specs["model.c"]) == {2: [[0, 3]], 3: [[0, 3]]}
    assert _ranks_and_boxes(specs["model.step"]) == {0: [], 1: []}
    assert _ranks_and_boxes(specs["model.shared"]) == {0: [[0, 2], [0, 1]], 1: [[0, 2], [1, 2]], 2: [[0, 2], [0, 1]], 3: [[0, 2], [1, 2]]}
    dst = dst_ptc(_src_ptc(), layout)
    held = {p.id: sorted(dst.subtensor_map[s].tensor for s in p.subtensors) for p in dst.partitions}
    assert held == {"rank0": ["model.b", "model.shared", "model.step"], "rank1": ["model.b", "model.shared", "model.step"],
                    "rank2": ["model.a", "model.c", "model.shared"], "rank3": ["model.a", "model.c", "model.shared"]}  # fmt: skip
    assert not dst.uncovered()


def test_pp_mesh_2_2_1_ranks_and_boxes():
    layout = MeshLayout((2, 2, 1), {"model.a": ["Stage(1)", "S(0)", "R"], "model.b": ["S(0)", "Stage(1)", "S(1)"],
                                    "model.c": ["Stage(0)", "Stage(1)", "R"], "*": ["Stage(0)", "R", "R"]})  # fmt: skip
    specs = {s.name: s for s in dst_specs(_src_ptc(), layout)}
    assert specs["model.a"].mesh_ranks == (2, 3) and _ranks_and_boxes(specs["model.a"]) == {2: [[0, 2], [0, 2]], 3: [[2, 4], [0, 2]]}
    assert specs["model.b"].mesh_ranks == (1, 3) and specs["model.b"].mesh_shape == (2, 1)  # mesh dim 1 staged: (0,1,0), (1,1,0)
    assert _ranks_and_boxes(specs["model.b"]) == {1: [[0, 2], [0, 5]], 3: [[2, 4], [0, 5]]}
    assert specs["model.c"].mesh_shape == (1,) and _ranks_and_boxes(specs["model.c"]) == {1: [[0, 3]]}  # every dim staged: one rank
    assert _ranks_and_boxes(specs["model.step"]) == {0: [], 1: []}
    assert specs["model.shared"].mesh_ranks == (0, 1)


def test_stage_slice_keeps_row_major_order():
    assert stage_slice("t", (3, 2, 2), (R(), Stage(1), S(0))) == ((3, 2), (R(), S(0)), (2, 3, 6, 7, 10, 11))
    with pytest.raises(PlacementError, match=r"placements\['t'\] = \['Stage\(3\)'\]: Stage\(3\) is outside mesh dim 0 of size 3"):
        stage_slice("t", (3,), (Stage(3),))


@st.composite
def staged_layouts(draw):
    """(tensor shape, mesh shape, placements with one Stage dim)."""
    shape = draw(shapes(min_ndim=0, max_ndim=3, max_side=7))
    mesh = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    stage_dim = draw(st.integers(0, len(mesh) - 1))
    kinds = [R()] + [S(d) for d in range(len(shape))]
    placements = [draw(st.sampled_from(kinds)) for _ in mesh]
    placements[stage_dim] = Stage(draw(st.integers(0, mesh[stage_dim] - 1)))
    return shape, mesh, tuple(placements)


def _torch_chunk_oracle(full, mesh, placements, coord):
    """What torch.chunk gives coordinate `coord` of the slice: each non-Stage dim in order."""
    local = full
    for m, p, c in zip(mesh, placements, coord):
        if isinstance(p, Shard):
            parts = torch.chunk(local, m, dim=p.dim)
            local = parts[c] if c < len(parts) else local.narrow(p.dim, local.shape[p.dim], 0)
    return local


@given(staged_layouts())
def test_stage_property_slice_holds_torch_chunk_boxes(case):
    shape, mesh, placements = case
    (spec,) = dst_specs(_src_ptc({"t": shape}), MeshLayout(mesh, {"t": [str(p) for p in placements]}))
    full = torch.arange(int(np.prod(shape)), dtype=torch.int64).reshape(shape)
    ((stage_dim, stage),) = ((d, p.index) for d, p in enumerate(placements) if isinstance(p, Stage))
    for rank in range(int(np.prod(mesh))):
        coord = coordinate_of(rank, mesh)
        box = spec.box_of_rank(rank)
        if coord[stage_dim] != stage:
            assert box is None, (rank, coord)
            continue
        want = _torch_chunk_oracle(full, mesh, placements, coord)
        got = full.numpy()[box.to_slices()]
        assert got.shape == tuple(want.shape) and got.tolist() == want.tolist(), (rank, coord, box)
    boxes = {(b.start, b.stop) for b in spec.boxes().values() if b.volume}  # replicas hold equal boxes
    count = np.zeros(shape, dtype=np.int64)
    for start, stop in boxes:
        count[tuple(slice(a, b) for a, b in zip(start, stop))] += 1
    assert (count == 1).all(), (mesh, placements, sorted(boxes))


# --- a real DCP checkpoint through pp=2 and back ------------------------------------------------

ORIGINAL = {
    "model.emb.weight": np.arange(20, dtype=np.float32).reshape(5, 4),
    "model.blocks.0.q.weight": np.arange(100, 124, dtype=np.float32).reshape(6, 4),
    "model.blocks.1.q.weight": np.arange(200, 224, dtype=np.float32).reshape(6, 4),
    "model.blocks.1.o.weight": np.arange(300, 320, dtype=np.float32).reshape(4, 5),
    "model.blocks.1.o.bias": np.arange(400, 403, dtype=np.int64),
    "optim.state.blocks.1.q.weight.exp_avg": np.arange(500, 524, dtype=np.float32).reshape(6, 4) / 8,
    "optim.state.blocks.1.q.weight.step": np.array(3.0, dtype=np.float32),
    "model.shared": np.arange(4, dtype=np.float32).reshape(2, 2),
}
PP2 = {"mesh": [2, 1, 2], "placements": {
    "model.blocks.1.q.weight": ["Stage(1)", "R", "S(0)"], "optim.state.blocks.1.q.weight.exp_avg": ["Stage(1)", "R", "S(0)"],
    "model.blocks.1.o.weight": ["Stage(1)", "R", "S(1)"], "model.blocks.0.q.weight": ["Stage(0)", "R", "S(0)"],
    "model.emb.*": ["Stage(0)", "R", "R"], "model.blocks.0.*": ["Stage(0)", "R", "R"], "model.blocks.1.*": ["Stage(1)", "R", "R"],
    "optim.state.blocks.1.*": ["Stage(1)", "R", "R"], "*": ["R", "R", "R"]}}  # fmt: skip
# What each tensor's DTensor is on the pp=2 job, written out by hand: (ranks, sub-mesh, placements).
PP2_SHARDS = {
    "model.emb.weight": ((0, 1), (1, 2), (R(), R())),
    "model.blocks.0.q.weight": ((0, 1), (1, 2), (R(), S(0))),
    "model.blocks.1.q.weight": ((2, 3), (1, 2), (R(), S(0))),
    "model.blocks.1.o.weight": ((2, 3), (1, 2), (R(), S(1))),
    "model.blocks.1.o.bias": ((2, 3), (1, 2), (R(), R())),
    "optim.state.blocks.1.q.weight.exp_avg": ((2, 3), (1, 2), (R(), S(0))),
    "optim.state.blocks.1.q.weight.step": ((2, 3), (1, 2), (R(), R())),
    "model.shared": ((0, 1, 2, 3), (2, 1, 2), (R(), R(), R())),
}


@pytest.fixture
def saved(tmp_path):
    """ORIGINAL saved by DCP itself in one process, with one non-tensor value."""
    state = {k: torch.from_numpy(a.copy()) for k, a in ORIGINAL.items()}
    state["epoch"] = 3
    dcp.save(state, checkpoint_id=str(tmp_path / "src"), no_dist=True)
    return tmp_path / "src"


def _rank_state(rank):
    """Rank `rank`'s state dict on the pp=2 job: zeroed local shards of its own tensors only."""
    state = {}
    for fqn, (ranks, mesh, placements) in PP2_SHARDS.items():
        if rank in ranks:
            a = ORIGINAL[fqn]
            box = TensorSpec(TensorMeta(fqn, a.shape, a.dtype.name), mesh, placements, ranks).box_of_rank(rank)
            state[fqn] = LocalShard(np.zeros(box.shape, a.dtype), a.shape, a.dtype.name, mesh, placements, ranks, rank)
    return {**state, "epoch": None}


def test_reshard_to_pp2_loads_per_rank_and_back(saved, tmp_path):
    reshard_dcp(saved, PP2, tmp_path / "pp2")
    files, _, _ = read_dcp(tmp_path / "pp2")
    for rank in range(4):
        held = {files.subtensor_map[s].tensor for s in files.partition_map[f"__{rank}_0"].subtensors}
        assert held <= {f for f, (ranks, _, _) in PP2_SHARDS.items() if rank in ranks}, rank  # replicas are saved once
        state = _rank_state(rank)
        load_dcp(state, tmp_path / "pp2", rank=rank)
        assert state["epoch"] == 3
        for fqn, shard in state.items():
            if fqn != "epoch":
                want = ORIGINAL[fqn][shard.spec(fqn).box_of_rank(rank).to_slices()]
                assert shard.array.tobytes() == want.tobytes() and shard.array.shape == want.shape, (fqn, rank)
    pp1 = {"mesh": [1, 2], "placements": {"model.blocks.1.o.weight": ["R", "S(1)"], "*": ["R", "R"]}}
    reshard_dcp(tmp_path / "pp2", pp1, tmp_path / "pp1")
    for path in (tmp_path / "pp1", tmp_path / "pp2"):  # DCP's own loader agrees, whole tensors
        whole = {k: np.zeros_like(a) for k, a in ORIGINAL.items()}
        mine = {k: torch.zeros(a.shape, dtype=getattr(torch, a.dtype.name)) for k, a in ORIGINAL.items()}
        load_dcp({**whole, "epoch": None}, path)
        dcp.load({**mine, "epoch": None}, checkpoint_id=str(path), no_dist=True)
        for fqn, a in ORIGINAL.items():
            assert whole[fqn].tobytes() == a.tobytes() and mine[fqn].numpy().tobytes() == a.tobytes(), (path.name, fqn)
