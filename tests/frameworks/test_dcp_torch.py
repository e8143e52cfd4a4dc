"""Cross-check against PyTorch itself, with real gloo CPU processes (forked, hard timeouts).

Run 1 (4 ranks): DTensor state under layout A — 1-D mesh (4) Shard(0)/Shard(1)/Replicate and a
2×2 mesh with [Shard(0), Shard(1)], [Replicate, Shard(0)], [Shard(0), Shard(0)], uneven sizes
and an empty shard; Adam state from `get_state_dict`; bf16/int64 tensors, a plain replicated
tensor, scalars — `dcp.save`d. Each rank also dumps `local_state` and loads A with DCP's own
load-time resharding into layout B2 (2×2, other placements).
Between runs tenplex reads A, reshards in-process to B2 and B1 and writes B1 (`reshard_dcp`).
Run 2 (3 ranks): DCP loads A into layout B1 (1-D mesh of 3) and loads tenplex's B1 directory;
tenplex's `load_dcp` loads A into B1 too.
Every rank's local tensor bytes and values must be identical between DCP and tenplex.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from fixtures.gloo import run_ranks as _run_ranks  # noqa: E402
from tenplex.frameworks.dcp.read import ptc_of_index, read_dcp, read_index  # noqa: E402
from tenplex.frameworks.dcp.reshard import reshard_arrays, reshard_dcp  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard, subtensor_id  # noqa: E402
from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc, dst_specs  # noqa: E402
from tenplex.frameworks.dtensor.state import ptc_from_state_dicts  # noqa: E402
from tenplex.frameworks.dtensor.values import python_value  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(120)]

B2 = {"mesh": [2, 2], "placements": {"model.l0.weight": ["S(1)", "S(0)"], "optim.state.l0.weight.exp_avg*": ["S(1)", "S(0)"],
                                     "model.emb": ["R", "S(1)"]}}  # fmt: skip
B1 = {"mesh": [3], "placements": {"model.emb": ["S(1)"], "extra.buf": ["R"]}}
# name: (shape, dtype, mesh "2x2" or "4", placements)
PARAMS = {
    "l0.weight": ((7, 5), "float32", "2x2", ("S0", "S1")),
    "l0.bias": ((7,), "float32", "2x2", ("R", "S0")),
    "l1.weight": ((3, 7), "float32", "4", ("S1",)),
    "l1.bias": ((3,), "float32", "4", ("S0",)),  # 3 over 4: [1, 1, 1, 0], an empty shard
    "emb": ((6, 4), "float32", "2x2", ("S0", "S0")),  # nested: dim 0 split twice
    "norm": ((5,), "float32", "4", ("R",)),
}


def _dump(path: Path, state: dict) -> None:
    from tenplex.frameworks.dtensor.state import local_state

    path.write_bytes(pickle.dumps(local_state(state)))


def _placements(names):
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if n == "R" else Shard(int(n[1:])) for n in names]


# ---- run 1: save A, DCP-load A into B2 --------------------------------------------------
def _state_a(rank: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    meshes = {"2x2": init_device_mesh("cpu", (2, 2)), "4": init_device_mesh("cpu", (4,))}

    def dt(shape, dtype, mesh, names, offset):
        full = (torch.arange(int(np.prod(shape)), dtype=torch.float64) * 0.5 + offset).reshape(shape).to(getattr(torch, dtype))
        return distribute_tensor(full, meshes[mesh], _placements(names), src_data_rank=None)

    model = torch.nn.Module()
    for i, (name, spec) in enumerate(PARAMS.items()):
        *outer, leaf = name.split(".")
        owner = model
        for part in outer:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, torch.nn.Parameter(dt(*spec, offset=100 * i)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.ones_like(p) * 0.25
    opt.step()
    msd, osd = get_state_dict(model, opt)
    extra = {"buf": dt((5, 3), "bfloat16", "4", ("S1",), 7), "ids": dt((10,), "int64", "2x2", ("S0", "R"), 3),
             "rng": torch.arange(4)}  # fmt: skip
    return {"model": msd, "optim": osd, "extra": extra, "step": 7, "meta": {"name": "run-1", "betas": (0.9, 0.99)}}


def _save_and_load_b2(rank: int, world: int, tmp: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = _state_a(rank)
    dcp.save(state, checkpoint_id=str(tmp / "A"))
    _dump(tmp / f"A.{rank}.pkl", state)
    _dump(tmp / f"B2.dcp.{rank}.pkl", _load_layout(tmp / "A", tmp / "A", B2))


def _load_layout(src: Path, ckpt: Path, layout_doc: dict, loader: str = "dcp") -> dict:
    """A state dict of zero DTensors in `layout_doc` (placements as tenplex derives them from
    `src`'s chunks), loaded from `ckpt` by DCP itself (or by tenplex's `load_dcp`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from tenplex.frameworks.dtensor.convert import torch_dtype

    layout = MeshLayout.from_json(layout_doc)
    src_ptc = ptc_of_index(read_index(src))
    mesh = init_device_mesh("cpu", layout.mesh)
    sd: dict = {}
    for spec in dst_specs(src_ptc, layout):
        zeros = torch.zeros(spec.meta.shape, dtype=torch_dtype(spec.meta.dtype))
        sd[spec.name] = distribute_tensor(zeros, mesh, _placements([str(p).replace("(", "").replace(")", "") for p in spec.placements]),
                                          src_data_rank=None)  # fmt: skip
    sd.update(dict.fromkeys({n for p in src_ptc.partitions for n, _ in p.values}))
    if loader == "tenplex":
        from tenplex.frameworks.dcp.load import load_dcp

        load_dcp(sd, ckpt)
    else:
        dcp.load(sd, checkpoint_id=str(ckpt))
    return sd


def _load_b1(rank: int, world: int, tmp: Path) -> None:
    _dump(tmp / f"B1.dcp.{rank}.pkl", _load_layout(tmp / "A", tmp / "A", B1))
    _dump(tmp / f"B1.tenplex.{rank}.pkl", _load_layout(tmp / "A", tmp / "B1", B1))
    _dump(tmp / f"B1.load_dcp.{rank}.pkl", _load_layout(tmp / "A", tmp / "A", B1, loader="tenplex"))


# ---- the parent -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcp_torch")
    _run_ranks(_save_and_load_b2, 4, tmp, "run1")
    src = read_dcp(tmp / "A")
    reshard_dcp(tmp / "A", B1, tmp / "B1")
    _run_ranks(_load_b1, 3, tmp, "run2")
    return tmp, src


def _ranks(tmp: Path, stem: str, world: int) -> list[dict]:
    return [pickle.loads((tmp / f"{stem}.{r}.pkl").read_bytes()) for r in range(world)]


def _assert_same(dcp_ranks: list[dict], ptc, arrays, values) -> int:
    """Every rank's local bytes and values equal; returns the number of tensors compared."""
    n = 0
    for r, flat in enumerate(dcp_ranks):
        for fqn, leaf in flat.items():
            if isinstance(leaf, LocalShard):
                got = arrays[subtensor_id(fqn, r)]
                assert got.dtype == leaf.array.dtype and got.shape == leaf.array.shape, (fqn, r)
                assert got.tobytes() == leaf.array.tobytes(), (fqn, r)
                n += 1
            else:
                assert python_value(values[f"rank{r}"][fqn]) == leaf, (fqn, r)
    return n


@pytest.mark.parametrize("layout, stem, world", [(B2, "B2.dcp", 4), (B1, "B1.dcp", 3)])
def test_dcp_load_resharding_equals_tenplex(runs, layout, stem, world):
    tmp, (src, arrays, values) = runs
    dst = dst_ptc(src, MeshLayout.from_json(layout))
    got, got_values, _ = reshard_arrays(src, arrays, values, dst)
    n = _assert_same(_ranks(tmp, stem, world), dst, got, got_values)
    assert n >= 20 * world  # every tensor (model, Adam moments and steps, extras) on every rank


@pytest.mark.parametrize("stem", ["B1.tenplex", "B1.load_dcp"])
def test_tenplex_written_dir_and_load_dcp_equal_dcp(runs, stem):
    """DCP loading tenplex's B1 directory, and tenplex's `load_dcp` reading A, give every rank
    the bytes and values DCP's own load-time resharding gives."""
    tmp, _ = runs
    tenplex_side, dcp_side = _ranks(tmp, stem, 3), _ranks(tmp, "B1.dcp", 3)
    for r in range(3):
        assert tenplex_side[r].keys() == dcp_side[r].keys()
        for fqn, leaf in dcp_side[r].items():
            other = tenplex_side[r][fqn]
            if isinstance(leaf, LocalShard):
                assert other.array.tobytes() == leaf.array.tobytes() and other.array.shape == leaf.array.shape, (fqn, r)
            else:
                assert other == leaf, (fqn, r)


def test_state_dicts_of_live_ranks_equal_what_dcp_saved(runs):
    """`ptc_from_state_dicts` on the ranks' own DTensor state (no files) describes the same
    data as the DCP directory; resharding it without files gives DCP's B2 bytes too."""
    tmp, (src, arrays, values) = runs
    live, live_arrays, live_values = ptc_from_state_dicts(_ranks(tmp, "A", 4))
    got, _, _ = reshard_arrays(src, arrays, values, live)
    assert all(got[sid].tobytes() == a.tobytes() for sid, a in live_arrays.items())
    assert live_values["rank3"]["meta.betas"] == (0.9, 0.99) and live_values["rank0"]["step"] == 7
    assert "optim.state.l1.bias.exp_avg_sq@rank3" in live.subtensor_map  # the empty shard
    assert live.subtensor_map["model.l1.bias@rank3"].shape == (0,)
    dst = dst_ptc(live, MeshLayout.from_json(B2))
    b2, b2_values, _ = reshard_arrays(live, live_arrays, live_values, dst)
    _assert_same(_ranks(tmp, "B2.dcp", 4), dst, b2, b2_values)


def test_optimizer_state_and_values_are_in_the_checkpoint(runs):
    _, (src, _, values) = runs
    names = set(src.tensor_map)
    for p in PARAMS:
        assert {f"optim.state.{p}.exp_avg", f"optim.state.{p}.exp_avg_sq", f"optim.state.{p}.step", f"model.{p}"} <= names
    merged = {k: v for vs in values.values() for k, v in vs.items()}
    assert merged["step"] == 7 and merged["meta.name"] == "run-1" and merged["optim.param_groups.0.lr"] == 0.01
    assert python_value(merged["meta.betas"]) == (0.9, 0.99)
