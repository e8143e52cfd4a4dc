"""The controller's side of `state`: moving a generation's state into the next generation's layout
(`Mover`: between the agents' stores with `reshard_stored`, or DCP files with `reshard_dcp`), and
the agents it needs for the job's lifetime (`state_home`)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.jobdir import saved_dir, state_dir
from tenplex.elastic.state import StateHome, mark_stored, saved_tag, state_tag


class Mover:
    """The controller's side: moves a generation's state into the next generation's layout."""

    def __init__(self, home: StateHome, job_dir: Path, runtime: Any = None):
        self.home, self.job_dir, self.runtime = home, job_dir, runtime
        self.stores: dict[str, str] = {}  # host -> its agent's local socket (with the store)
        self.lost: set[str] = set()  # hosts lost during the job
        self.metas: dict[str, dict] = {}  # tag -> its .meta records (`_meta`)

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
        return bool(self._meta(self._tag(kind, generation)))

    def tensors(self, kind: str, generation: int) -> set[str]:
        """The tensor FQNs that checkpoint holds."""
        if self.home.store is None:
            from tenplex.frameworks.dcp.read import read_index

            return {t.name for t in read_index(self._dir(kind, generation)).tensors}
        from tenplex.ir.serialize import ptc_from_json

        meta = self._meta(self._tag(kind, generation))
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
        self.metas.pop(state_tag(to), None)
        hook = functools.partial(_with_store_replicas, n=replicas, hosts=sorted(self.runtime.agents)) if replicas else None
        done = reshard_stored(self.runtime, self.home.name, self._tag(kind, generation), state_tag(to), layout, hosts=hosts,
                              records=records, src_hook=self._survivors, dst_hook=hook)  # fmt: skip
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
        meta = self._meta(tag)
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
        self.lost.update(hosts)
        self.runtime.forget(hosts)
        for h in hosts:
            self.stores.pop(h, None)

    def _meta(self, tag: str) -> dict:
        """The tag's records, read once from the stores (a tag does not change once committed)."""
        if tag not in self.metas:
            meta = self.runtime.tag_meta(self.home.name, tag)
            if not meta:
                return meta  # not (yet) committed: ask again next time
            self.metas[tag] = meta
        return self.metas[tag]

    def _survivors(self, src: Any) -> Any:
        """`src` without the devices of lost hosts (`recovery.survivors`: RecoveryError names a
        partition no survivor holds)."""
        from tenplex.elastic.recovery import survivors

        failed = self.lost & set(src.topology.hosts)
        return survivors(src, failed) if failed else src

    def forget(self, generation: int) -> None:
        """Drop what generation `generation` started from and saved (the next one has its state)."""
        if self.home.store is not None:
            for tag in (saved_tag(generation), state_tag(generation)):
                self.runtime.drop(self.home.name, tag)
                self.metas.pop(tag, None)

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
