"""A job's DCP state in the agents' stores: real gloo ranks save with `dcp.save(storage_writer=
StoreWriter(...))` into real `tenplex agent` processes, the runtime reshards it peer to peer
between two agents (`reshard_stored`), and ranks of another layout load it with `dcp.load(
storage_reader=StoreReader(...))`. Every local tensor and value must equal what PyTorch's own
files-and-resharding path gives (`dcp.save` to files, `dcp.load` into the new layout), bit for
bit; the saved bytes are visible through the agent's REST API as they are.
"""

from __future__ import annotations

import json
import pickle
import urllib.request
from pathlib import Path

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from fixtures.gloo import run_ranks  # noqa: E402
from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.reshard import reshard_stored  # noqa: E402
from tenplex.frameworks.dtensor.layout import LocalShard  # noqa: E402
from tenplex.frameworks.dtensor.state import local_state  # noqa: E402
from tenplex.ir.errors import ExecutionError  # noqa: E402
from tenplex.runtime import Runtime  # noqa: E402
from tenplex.runtime.agent.fleet import AgentFleet  # noqa: E402
from tenplex.runtime.shm import StoreClient  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(180)]

SAVED = {"mesh": [2], "w": "S(0)", "emb": "R"}  # 2 ranks
LOADED = {"mesh": [3], "w": "S(1)", "emb": "S(0)"}  # 3 ranks
LAYOUT = {"format": "tenplex.dtensor-layout/1", "mesh": [3],
          "placements": {"model.w": ["S(1)"], "model.emb": ["S(0)"], "optim.state.w.exp_avg": ["S(1)"], "*": ["R"]}}  # fmt: skip


def _state(layout: dict, zero: bool = False) -> dict:
    """A model and Adam-like state in `layout` (deterministic), or zeros of the same layout."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", tuple(layout["mesh"]))
    place = lambda p: [Replicate()] if p == "R" else [Shard(int(p[2]))]  # noqa: E731
    g = torch.Generator().manual_seed(3)
    w = torch.randn(7, 5, generator=g)
    emb = torch.randn(6, 4, generator=g).to(torch.bfloat16)
    avg = torch.randn(7, 5, generator=g)
    tensors = {"w": w, "emb": emb, "avg": avg, "step": torch.tensor(4.0), "plain": torch.arange(5)}
    if zero:
        tensors = {k: torch.zeros_like(v) for k, v in tensors.items()}
    return {"model": {"w": distribute_tensor(tensors["w"], mesh, place(layout["w"])),
                      "emb": distribute_tensor(tensors["emb"], mesh, place(layout["emb"]))},
            "optim": {"state": {"w": {"exp_avg": distribute_tensor(tensors["avg"], mesh, place(layout["w"])),
                                      "step": tensors["step"]}}},
            "plain": tensors["plain"], "iteration": 0 if zero else 7, "rng": None if zero else (1, "a")}  # fmt: skip


def _save(stores: dict[str, str]):
    def fn(rank: int, world: int, tmp: Path) -> None:
        import torch.distributed.checkpoint as dcp

        from tenplex.frameworks.dcp.storage import StoreWriter

        state = _state(SAVED)
        dcp.save(state, checkpoint_id=str(tmp / "files"))
        dcp.save(state, storage_writer=StoreWriter(stores["h0"], job="j", tag="g0", job_id="J"))

    return fn


def _load(sockets: list[str], tag: str):
    def fn(rank: int, world: int, tmp: Path) -> None:
        import torch.distributed.checkpoint as dcp

        from tenplex.frameworks.dcp.storage import StoreReader

        layout = LOADED if world == 3 else SAVED
        ours, theirs = _state(layout, zero=True), _state(layout, zero=True)
        dcp.load(ours, storage_reader=StoreReader(sockets[rank], job="j", tag=tag, job_id="J"))
        dcp.load(theirs, checkpoint_id=str(tmp / "files"))
        (tmp / f"{tag}.{rank}.pkl").write_bytes(pickle.dumps((local_state(ours), local_state(theirs))))
        with pytest.raises(BaseException, match="another job"):  # DCP wraps it in a CheckpointException
            dcp.load(_state(layout, zero=True), storage_reader=StoreReader(sockets[rank], job="j", tag=tag, job_id="K"))

    return fn


def _same(a, b) -> bool:
    if isinstance(a, LocalShard):
        fields = [f.name for f in attrs.fields(LocalShard) if f.name != "array"]
        return [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields] and _same(a.array, b.array)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


def _check_loaded(tmp: Path, tag: str, world: int) -> None:
    for rank in range(world):
        ours, theirs = pickle.loads((tmp / f"{tag}.{rank}.pkl").read_bytes())
        assert sorted(ours) == sorted(theirs)
        bad = [k for k in ours if not _same(ours[k], theirs[k])]
        assert not bad, f"rank {rank}: {bad} differ from DCP's own load"
        assert ours["iteration"] == 7 and ours["rng"] == (1, "a")


def test_state_saved_into_a_store_is_resharded_by_the_runtime_and_loaded_by_dcp(tmp_path):
    with AgentFleet(["h0", "h1"], local=True, rest=True) as fleet, Runtime.connect(fleet.controls) as rt:
        run_ranks(_save(fleet.stores), 2, tmp_path, "save")
        meta = rt.tag_meta("j", "g0")
        assert meta["dcp"]["job_id"] == "J" and rt.exists("j", ".saving-g0") == {"h0": False, "h1": False}

        # the saved bytes, through REST, are the bytes DCP wrote to its files
        path = "/job/j/g0/1/model.w@[4,0]"  # rank 1's shard of w: rows 4..6
        with urllib.request.urlopen(f"{fleet.rest_urls['h0']}/query?path={path}") as r:
            shape = tuple(int(n) for n in r.headers["X-Tensor-Shape"].split(","))
            got = np.frombuffer(r.read(), np.float32).reshape(shape)
        want = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))[4:].numpy()
        assert got.tobytes() == want.tobytes()

        # the same layout loads straight back; then the runtime moves it to 3 ranks on two hosts
        run_ranks(_load([fleet.stores["h0"]] * 2, "g0"), 2, tmp_path, "load0")
        _check_loaded(tmp_path, "g0", 2)
        moved = reshard_stored(rt, "j", "g0", "g1", LAYOUT, hosts={0: "h0", 1: "h1", 2: "h1"})
        assert moved.sent["h0"] > 0 and set(moved.seconds) == {"plan", "move"}
        run_ranks(_load([fleet.stores["h0"], fleet.stores["h1"], fleet.stores["h1"]], "g1"), 3, tmp_path, "load1")
        _check_loaded(tmp_path, "g1", 3)


def _save_on_hosts(stores: dict[str, str]):
    """Rank r saves into host h<r>'s store, then each completes its host's part of the tag."""

    def fn(rank: int, world: int, tmp: Path) -> None:
        import torch.distributed.checkpoint as dcp

        from tenplex.frameworks.dcp.storage import StoreWriter, complete_save

        store = stores[f"h{rank}"]
        metadata = dcp.save(_state(SAVED), storage_writer=StoreWriter(store, job="j", tag="g0", job_id="J"))
        dcp.save(_state(SAVED), checkpoint_id=str(tmp / "files"))
        (tmp / f"completed{rank}").write_text(str(complete_save(store, "j", "g0", metadata)))

    return fn


def test_a_save_spanning_hosts_completes_on_each_and_moves_between_them(tmp_path):
    with AgentFleet(["h0", "h1"], local=True) as fleet, Runtime.connect(fleet.controls) as rt:
        run_ranks(_save_on_hosts(fleet.stores), 2, tmp_path, "save")
        # the coordinator's host was completed by the save, the other by complete_save
        assert [(tmp_path / f"completed{r}").read_text() for r in (0, 1)] == ["False", "True"]
        assert rt.exists("j", "g0") == {"h0": True, "h1": True} and rt.exists("j", ".saving-g0") == {"h0": False, "h1": False}
        from tenplex.frameworks.dcp.storage import StoreReader

        with pytest.raises(BaseException, match="on host h1, not here: move the state"):  # DCP held replicas once
            import torch.distributed.checkpoint as dcp

            whole = {"model": {"w": torch.zeros(7, 5), "emb": torch.zeros(6, 4, dtype=torch.bfloat16)}}
            dcp.load(whole, storage_reader=StoreReader(fleet.stores["h0"], "j", "g0"))
        moved = reshard_stored(rt, "j", "g0", "g1", LAYOUT, hosts={0: "h1", 1: "h0", 2: "h0"})  # the hosts swap ranks
        assert moved.sent["h0"] > 0 and moved.sent["h1"] > 0
        run_ranks(_load([fleet.stores["h1"], fleet.stores["h0"], fleet.stores["h0"]], "g1"), 3, tmp_path, "load1")
        _check_loaded(tmp_path, "g1", 3)


def test_a_dead_agent_leaves_the_saved_state_and_names_its_host(tmp_path):
    with AgentFleet(["h0", "h1"], local=True) as fleet, Runtime.connect(fleet.controls, liveness=5) as rt:
        run_ranks(_save(fleet.stores), 2, tmp_path, "save")
        fleet.kill("h1")
        with pytest.raises(ExecutionError, match="h1"):
            reshard_stored(rt, "j", "g0", "g1", LAYOUT, hosts={0: "h0", 1: "h1", 2: "h1"})
        with StoreClient(fleet.stores["h0"]) as client:  # the saved state is whole; nothing of g1 is left
            assert client.exists("/job/j/g0/.meta/ptc") and not client.walk("/job/j/g1") and not client.walk("/job/j/.staging-g1")
        run_ranks(_load([fleet.stores["h0"]] * 2, "g0"), 2, tmp_path, "reload")
        _check_loaded(tmp_path, "g0", 2)
    with AgentFleet(["h0"], local=True) as fleet, Runtime.connect(fleet.controls) as rt, \
            pytest.raises(DcpError, match="no complete tenplex DCP state"):  # fmt: skip
        reshard_stored(rt, "j", "nothing", "g1", LAYOUT)


def test_a_save_never_replaces_a_tag_and_a_failed_save_leaves_nothing(tmp_path):
    from tenplex.frameworks.dcp.storage import StoreReader, StoreWriter

    with AgentFleet(["h0"], local=True) as fleet:
        import torch.distributed.checkpoint as dcp

        state = {"w": torch.arange(6.0).reshape(2, 3), "n": 3}
        dcp.save(state, storage_writer=StoreWriter(fleet.stores["h0"], job="j", tag="t"))
        with pytest.raises(BaseException, match="already exists"):
            dcp.save(state, storage_writer=StoreWriter(fleet.stores["h0"], job="j", tag="t"))
        got = {"w": torch.zeros(2, 3), "n": 0}
        dcp.load(got, storage_reader=StoreReader(fleet.stores["h0"], job="j", tag="t"))
        assert torch.equal(got["w"], state["w"]) and got["n"] == 3
        with pytest.raises(BaseException, match="holds no complete tenplex DCP state"):
            dcp.load(got, storage_reader=StoreReader(fleet.stores["h0"], job="j", tag="absent"))
        with pytest.raises(BaseException, match="float8_e4m3fnuz"):  # a dtype tenplex does not hold: nothing is kept
            dcp.save({"z": torch.zeros(2).to(torch.float8_e4m3fnuz)}, storage_writer=StoreWriter(fleet.stores["h0"], job="j", tag="bad"))
        with StoreClient(fleet.stores["h0"]) as client:
            assert not client.exists("/job/j/bad") and client.walk("/job/j/.saving-bad") == []


@pytest.mark.fuse
def test_the_saved_state_is_files_in_the_agents_fuse_view(tmp_path):
    import subprocess
    import sys
    import time

    import torch.distributed.checkpoint as dcp

    from tenplex.frameworks.dcp.storage import StoreWriter
    from tenplex.runtime.fuse.store import fuse_unavailable_reason

    if (reason := fuse_unavailable_reason()) is not None:
        pytest.skip(f"FUSE unavailable: {reason}")
    sock, store, files = tmp_path / "h0.sock", tmp_path / "h0.store", tmp_path / "files"
    agent = subprocess.Popen([sys.executable, "-m", "tenplex.cli", "agent", "--name", "h0", "--control", str(sock),
                              "--local", str(store), "--mount", str(files)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert agent.stdout.readline().startswith(f"tenplex agent h0: control {sock}, local {store}, files {files}")
        state = {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "step": 5}
        dcp.save(state, storage_writer=StoreWriter(str(store), job="j", tag="t"))
        for _ in range(50):  # the kernel may cache the empty directory for the attribute timeout (1 s)
            if (files / "job" / "j" / "t").exists():
                break
            time.sleep(0.1)
        import ml_dtypes  # noqa: F401 (np.load of a bfloat16 .npy)

        w = np.load(files / "job" / "j" / "t" / "0" / "w@[0,0].npy")
        assert str(w.dtype) == "bfloat16" and w.astype(np.float32).tolist() == state["w"].float().tolist()
        assert json.loads((files / "job" / "j" / "t" / "0" / ".values" / "rank0" / "step.json").read_text()) == 5
    finally:
        agent.terminate()
        agent.wait(20)
    assert not any(files.iterdir())  # unmounted with the agent
