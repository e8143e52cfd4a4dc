"""Where a generation's training state goes between generations: the hosts' tenplex stores (the
default) or DCP files in the job directory (`state: files` in the job file, one host only).

With the store, the controller starts an agent with a local socket on every host (`state_home`)
and passes each host's ranks their agent's socket (TENPLEX_STORE, with TENPLEX_JOB_NAME and
TENPLEX_JOB_ID); generation N saves with DCP into tag `saved-N` (`frameworks.dcp.storage.
StoreWriter`; one rank per host completes its host's part), the controller moves that tag peer
to peer into generation N + 1's layout and hosts as `state-<N+1>` (`reshard_stored`, optionally
with store replicas on the next hosts), committing the data state with it on every host, and
generation N + 1 loads both from its host's store (`StoreReader`). No checkpoint file is
written; the job's final state is written to `saved/gen-N/checkpoint` at the end (`persist`).
With files, generation N `dcp.save`s into `saved/gen-N` and the controller reshards the files into
`state/gen-<N+1>` (`reshard_dcp`), which the next generation loads (`load_dcp`).

Either way the controller's control files stay in the first host's job directory (`jobdir`): what
rank 0 writes (timings, `COMPLETE`, metrics, the declaration) and its own copies of the data
state; `state/gen-N/STORED` marks a generation whose state is the store tag `state-N`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.jobdir import saved_dir, state_dir

STORED = "STORED"  # state/gen-N/STORED: generation N's state is the store tag state-N


def saved_tag(generation: int) -> str:
    return f"saved-{generation}"


def state_tag(generation: int) -> str:
    return f"state-{generation}"


@attrs.frozen
class StateHome:
    """The store of this job's host (`store`: its local socket), or None: DCP files."""

    store: str | None = None
    name: str = "job"  # the job's name in the store (/job/<name>/...)
    job_id: str | None = None  # marks the state as this job's: a store holding another's is refused

    @classmethod
    def from_env(cls, env: dict[str, str]) -> StateHome:
        return cls(env.get("TENPLEX_STORE") or None, env.get("TENPLEX_JOB_NAME") or "job", env.get("TENPLEX_JOB_ID") or None)

    def env(self) -> dict[str, str]:
        return {} if self.store is None else {"TENPLEX_STORE": self.store, "TENPLEX_JOB_NAME": self.name,
                                              "TENPLEX_JOB_ID": self.job_id or ""}  # fmt: skip

    def resuming(self, job_dir: Path, generation: int) -> bool:
        """True when generation `generation` has a state to load (see the module docstring)."""
        if self.store is None:
            return (state_dir(job_dir, generation) / ".metadata").exists()
        return self.record(generation, "dcp") is not None

    def record(self, generation: int, name: str) -> Any:
        """With the store: the record `name` of generation `generation`'s state tag in this host's
        store (`dcp`, `data_state`, ...), or None; without: None."""
        if self.store is None or generation == 0:
            return None
        from tenplex.runtime.shm.client import StoreClient
        from tenplex.runtime.store.layout import meta_path

        path = meta_path(self.name, state_tag(generation), name)
        with StoreClient(self.store) as client:
            return client.get([path])[path] if client.exists(path) else None

    def load(self, state_dict: dict[str, Any], job_dir: Path, generation: int, rank: int) -> None:
        """Fill `state_dict` in place from generation `generation`'s state."""
        if self.store is None:
            from tenplex.frameworks.dcp.load import load_dcp

            load_dcp(state_dict, state_dir(job_dir, generation), rank=rank)
            return
        import torch.distributed.checkpoint as dcp

        from tenplex.frameworks.dcp.storage import StoreReader

        try:
            dcp.load(state_dict, storage_reader=StoreReader(self.store, self.name, state_tag(generation), job_id=self.job_id))
        except BaseException as e:  # DCP wraps every rank's error in a CheckpointException (a BaseException)
            if type(e).__name__ != "CheckpointException":
                raise
            raise ElasticError(f"generation {generation}: loading its state from the store failed: {_first_line(e)}") from None

    def save(self, state_dict: dict[str, Any], job_dir: Path, generation: int, group: Any = None) -> None:
        """Save generation `generation`'s state with DCP (over `group`, default: every rank)."""
        import torch.distributed.checkpoint as dcp

        if self.store is None:
            dcp.save(state_dict, checkpoint_id=str(saved_dir(job_dir, generation)), process_group=group)
            return
        from tenplex.frameworks.dcp.storage import StoreWriter, complete_save

        writer = StoreWriter(self.store, self.name, saved_tag(generation), job_id=self.job_id, replace=True)
        metadata = dcp.save(state_dict, storage_writer=writer, process_group=group)
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one rank per host completes its host's part
            complete_save(writer.client, self.name, saved_tag(generation), metadata, replace=True)


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if "tenplex" in line or "Error:" in line]
    return (lines[-1] if lines else str(e).splitlines()[0]).strip()


def mark_stored(job_dir: Path, generation: int) -> Path:
    """Mark generation `generation`'s state as the store tag `state-N` (the controller, last)."""
    there = state_dir(job_dir, generation)
    there.mkdir(parents=True, exist_ok=True)
    (there / STORED).write_text(state_tag(generation) + "\n")
    return there


class Mover:
    """The controller's side: moves a generation's state into the next generation's layout."""

    def __init__(self, home: StateHome, job_dir: Path, runtime: Any = None):
        self.home, self.job_dir, self.runtime = home, job_dir, runtime
        self.stores: dict[str, str] = {}  # host -> its agent's local socket (with the store)

    def node_env(self, node: Any) -> dict[str, str]:
        """The variables that send a host's ranks to its own store (`StateHome.from_env`)."""
        if self.home.store is None:
            return {}
        return attrs.evolve(self.home, store=self.stores.get(node.name, self.home.store)).env()

    def holds(self, kind: str, generation: int) -> bool:
        """Whether `kind` ("saved" or "state"; "start": never) of `generation` holds a checkpoint."""
        if kind == "start":
            return False
        if self.home.store is None:
            return (self._dir(kind, generation) / ".metadata").exists()
        return bool(self.runtime.tag_meta(self.home.name, self._tag(kind, generation)))

    def tensors(self, kind: str, generation: int) -> set[str]:
        """The tensor FQNs that checkpoint holds."""
        if self.home.store is None:
            from tenplex.frameworks.dcp.read import read_index

            return {t.name for t in read_index(self._dir(kind, generation)).tensors}
        from tenplex.ir.serialize import ptc_from_json

        meta = self.runtime.tag_meta(self.home.name, self._tag(kind, generation))
        return {t.name for t in ptc_from_json(meta["ptc"]).tensors}

    def move(self, kind: str, generation: int, to: int, layout: dict, hosts: dict[int, str] | None = None,
             records: dict[str, Any] | None = None, replicas: int = 0) -> tuple[int, dict[str, float]]:  # fmt: skip
        """Reshard `kind` of `generation` into generation `to`'s state in `layout`: (bytes moved
        between ranks, seconds per phase: `plan` and `move` with the store, `reshard` with files).
        With the store, `hosts` puts rank r on host hosts[r] and `records` (the data state) are
        committed with the new tag on every host, so no host needs a file from the controller;
        `replicas` store replicas of every partition go to the next hosts (idle ones included).
        Raises DcpError / CompileError when the checkpoint lacks part of the state, ExecutionError."""
        if self.home.store is None:
            import time

            from tenplex.frameworks.dcp.reshard import reshard_dcp

            start = time.time()
            moved = reshard_dcp(self._dir(kind, generation), layout, state_dir(self.job_dir, to)).bytes_moved
            return moved, {"reshard": time.time() - start}
        from tenplex.frameworks.dcp.reshard import reshard_stored

        self.runtime.drop(self.home.name, state_tag(to))  # a partial one of an earlier attempt
        hook = functools.partial(_with_store_replicas, n=replicas, hosts=sorted(self.runtime.agents)) if replicas else None
        done = reshard_stored(self.runtime, self.home.name, self._tag(kind, generation), state_tag(to), layout, hosts=hosts,
                              records=records, dst_hook=hook)  # fmt: skip
        mark_stored(self.job_dir, to)
        return done.bytes_moved, done.seconds

    def persist(self, generation: int) -> Path | None:
        """With the store: write generation `generation`'s save as DCP files into
        `saved/gen-N/checkpoint` (the job's final state outlives the agent; `dcp.load` reads it).
        None with files (the save is files already) or when there is no save."""
        if self.home.store is None or not self.holds("saved", generation):
            return None
        from tenplex.frameworks.dcp.write import write_dcp
        from tenplex.ir.serialize import ptc_from_json

        tag = saved_tag(generation)
        meta = self.runtime.tag_meta(self.home.name, tag)
        arrays, values = self.runtime.fetch(self.home.name, tag)
        out = saved_dir(self.job_dir, generation) / "checkpoint"
        mapping = {fqn: tuple(keys) for fqn, keys in meta["dcp"]["mapping"].items()}
        write_dcp(ptc_from_json(meta["ptc"]), {sid: a for (sid, _), a in arrays.items()},
                  {pid: v for (pid, _), v in values.items()}, out, mapping=mapping)  # fmt: skip
        return out

    def layout(self, kind: str, generation: int, dst: Any) -> dict:
        """The dst layout (`dst`: a ParallelConfig) from the program's declaration saved with
        that state (`parallel.json`), for the tensors the state has. Raises ElasticError when the
        program declared nothing (`Job.declare`)."""
        from tenplex.elastic.layouts import PARALLEL, Parallelism
        from tenplex.ir.files import read_json

        path = self._dir(kind, generation) / PARALLEL
        if not path.exists():
            raise ElasticError(f"generation {generation}: the program declared no parallelism ({path} is missing): call "
                               "job.declare(plan, first=..., layers=..., last=...) before job.save, so tenplex can "
                               "derive the next layout")  # fmt: skip
        declared = Parallelism.from_json(read_json(path, ElasticError, "parallelism declaration", 64 << 20), str(path))
        return declared.layout(dst.tp, dst.dp, dst.pp, self.tensors(kind, generation))

    def lost_hosts(self) -> list[str]:
        """Hosts whose agent no longer answers (with the store on several hosts; else none)."""
        if self.runtime is None or len(self.runtime.agents) < 2:
            return []
        return sorted(h for h, ok in self.runtime.alive().items() if not ok)

    def forget_hosts(self, hosts: list[str]) -> None:
        """Leave lost hosts out of every later move."""
        self.runtime.forget(hosts)
        for h in hosts:
            self.stores.pop(h, None)

    def forget(self, generation: int) -> None:
        """Drop what generation `generation` started from and saved (the next one has its state)."""
        if self.home.store is not None:
            for tag in (saved_tag(generation), state_tag(generation)):
                self.runtime.drop(self.home.name, tag)

    def _dir(self, kind: str, generation: int) -> Path:
        return saved_dir(self.job_dir, generation) if kind == "saved" else state_dir(self.job_dir, generation)

    @staticmethod
    def _tag(kind: str, generation: int) -> str:
        return saved_tag(generation) if kind == "saved" else state_tag(generation)


def _with_store_replicas(dst: Any, n: int, hosts: list[str]) -> Any:
    """`dst` with n store replicas of each partition on the next hosts among `hosts` (those
    without a rank of dst get a spare device first; at most one replica per other host)."""
    from tenplex.elastic.recovery import with_replicas
    from tenplex.ir.ptc import PTC
    from tenplex.ir.topology import Device, Topology

    spare = [h for h in hosts if h not in dst.topology.hosts]
    first = max(d.id for d in dst.topology.devices) + 1
    devices = (*dst.topology.devices, *(Device(first + i, h) for i, h in enumerate(spare)))
    dst = PTC(dst.tensors, dst.subtensors, dst.partitions, dst.allocation, Topology(devices, dst.topology.links))
    return with_replicas(dst, min(n, len(hosts) - 1))


HOST = "h0"  # the agent of this machine: a job spans one host


@contextlib.contextmanager
def state_home(state: str, job_dir: Path, out: Callable[[str], None], cluster: Any = None) -> Iterator[Mover]:
    """The controller's `Mover` for the job's lifetime: with "store", an agent on every host of
    `cluster` (this machine's alone by default; its store served on a local socket) and a
    runtime connected to them all, `Mover.node_env(node)` naming each host's store; with
    "files", nothing more (one host only: files are not shared between hosts)."""
    # the first reshard would import torch and the compiler (seconds): do it while generation 0 trains
    threading.Thread(target=importlib.import_module, args=("tenplex.frameworks.dcp.reshard",), daemon=True).start()
    if state != "store":
        if cluster is not None and cluster.multi:
            raise ElasticError("state: files needs a job on one host (the hosts share no filesystem); use state: store")
        yield Mover(StateHome(), job_dir)
        return
    from tenplex.runtime.agent.fleet import AgentFleet
    from tenplex.runtime.runtime import Runtime

    names = [n.name for n in cluster.nodes] if cluster is not None else [HOST]
    hosts = cluster.hosts if cluster is not None else None
    with AgentFleet(names, hosts=hosts, local=True) as fleet, Runtime.connect(fleet.controls) as runtime:
        home = StateHome(fleet.stores[names[0]], "job", uuid.uuid4().hex)
        out(f"state in the stores of agent(s) {', '.join(names)} (job id {home.job_id})")
        mover = Mover(home, job_dir, runtime)
        mover.stores = dict(fleet.stores)
        yield mover
