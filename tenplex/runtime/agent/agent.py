"""A per-host agent: owns the host's `TensorStore` and transport (a `UcxPeer`, or with
`transport="cma"` a `CmaPeer` between agents of one machine) and executes its share of a plan.

The agent obeys commands from a runtime; `agent.server` runs it as a process (spawned by
`Runtime.local`, or `tenplex agent` listening for runtimes) and turns each command (a name and
keyword arguments, over the typed control wire) into a method call here; a failure goes back as
text naming the command and, where known, the message and op that failed (the runtime adds the
host). Commands: `name`, `address`, `connect`, `load`, `load_files`, `rename_tag`, `reserve`, `premap`,
`keep_slice` (`sliced.KeptSlices`), `prepare`, `run`, `commit`, `abort`, `fetch`, `delete_tag`, `exists`,
`memory`, `rest_url`, `tag_meta`, `stop` (`load_files` and `prepare`'s `files`: arrays straight from and into local
`.npy` files, `agent.files`). With `local`, the agent also serves its store to this machine's
processes on that Unix socket (`runtime.shm`: training programs save into it and load from it
through shared memory).

Store layout: `store.layout`. Execution (`rounds`): `prepare` decodes this host's slice of the
plan (`compiler.emit.slices`: only its arrays, regions and parts, no plan or PTC to parse),
checks the src arrays it reads exist and the dst tag does not, and creates the dst arrays under
the staging tag. `run` runs every round in order, without a barrier between rounds: fills and
values first, then per round the local copies (region to region) overlapping every network part
of the round, posted at once to all peers (`UcxPeer.exchange`: no headers, no ordering between
them, so no deadlock and every link busy), contiguous parts zero-copy and the rest through the
scratch pool (`parts`); parts between agents on one node go by one copy into the receiver's
shared memory instead (`direct`). The plan's schedule bounds a round's bytes per host, and so the scratch
pool. `commit` renames staging to the dst tag in one store step; `abort` deletes staging. The
src tag is only ever read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import direct, parts, rounds
from tenplex.runtime.agent import files as local_files
from tenplex.runtime.agent.rounds import Execution
from tenplex.runtime.agent.sliced import KeptSlices, Sliced
from tenplex.runtime.agent.tags import TagCommands
from tenplex.runtime.shm.server import StoreServer
from tenplex.runtime.store import shared
from tenplex.runtime.store.layout import Instance, array_path, meta_path, staging_tag, tag_path, value_path
from tenplex.runtime.store.tree import TensorStore
from tenplex.runtime.transport.errors import Cancel

__all__ = ["Agent", "Instance", "node_id", "tag_path"]



def node_id() -> str:
    """This machine and network namespace: agents with equal ids can use shared memory."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return f"{boot}/net:{os.stat('/proc/self/ns/net').st_ino}"


class Agent(TagCommands, KeptSlices):
    """One host's store and UCX worker. `ucx_ip` (with `ucx_port`, 0 = any) opens a UCX TCP
    listener on that address for agents on other nodes. `memory_budget` bounds the store's
    resident bytes (beyond it, arrays spill to `spill_dir`, or a put fails cleanly)."""

    def __init__(self, host: str, timeout: float = 30.0, ucx_ip: str | None = None, ucx_port: int = 0,
                 memory_budget: int | None = None, spill_dir: str | None = None, local: str | None = None,
                 transport: str = "ucx"):  # fmt: skip
        self.host, self.timeout, self.transport = host, timeout, transport
        self.ucx_ip, self.ucx_port = ucx_ip, ucx_port
        self.store = TensorStore(memory_budget, spill_dir)
        self.peer: Any = None
        self.cancel = Cancel()  # raised by `server` when the runtime cancels the running command
        self.endpoints: dict[str, Any] = {}
        self.execution: Execution | None = None
        self.slices: dict[str, Sliced] = {}  # decoded slices sent on this connection, by slice id (oldest first)
        self.scratch = parts.Scratch()  # pack and landing buffers, reused round after round
        self.maps = direct.Mappings()  # same-node peers' dst arenas this agent copies into
        # dst arenas of dropped tags, pages kept for the next execution (none under a memory budget)
        self.pool = shared.ArenaPool() if memory_budget is None else None
        self.rest: Any = None
        self.local = StoreServer(self.store, local, host).start() if local else None

    def _peer(self) -> Any:
        """The transport: with `transport="cma"` (agents of `Runtime.local(transport="cma")`, all
        on this machine) a `CmaPeer` where the kernel lets agents read each other's memory, which
        never loads UCX; else the `UcxPeer`."""
        if self.peer is None and self.transport == "cma" and self.ucx_ip is None:
            from tenplex.runtime.transport import cma

            if cma.unusable() is None:
                self.peer = cma.CmaPeer(self.host, self.timeout, self.cancel)
        return self.peer if self.peer is not None else self._ucx()

    def _ucx(self) -> Any:
        if self.peer is None:
            from tenplex.runtime.transport.ucx import UcxPeer  # only agents need UCX

            self.peer = UcxPeer(self.host, timeout=self.timeout, cancel=self.cancel)
        return self.peer

    # ---- commands --------------------------------------------------------------------
    def name(self) -> str:
        return self.host

    def address(self) -> dict[str, Any]:
        """How peers reach this agent: {"worker": UCX worker address, "node": machine and network
        namespace, "tcp": [ip, port] of the UCX listener or None}."""
        peer = self._peer()
        if getattr(peer, "takes_views", False):
            return {"worker": None, "cma": peer.address, "node": node_id(), "tcp": None}
        tcp = [self.ucx_ip, peer.listen(self.ucx_port)] if self.ucx_ip is not None else None
        return {"worker": peer.address, "node": node_id(), "tcp": tcp}

    def connect(self, peers: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Connect to every other agent in `peers` ({host: its `address()`}); returns {host: mode}.

        Same node: shared memory (worker address, both directions). Other nodes: UCX over TCP; an
        agent dials the hosts named after it and then accepts the ones named before it, so the
        dialling order has no cycle and every pair connects once."""
        me = node_id()
        remote = sorted(h for h, a in peers.items() if h != self.host and h not in self.endpoints and a["node"] != me)
        local = {h: a for h, a in sorted(peers.items()) if h != self.host and h not in self.endpoints and a["node"] == me}
        if getattr(self._peer(), "takes_views", False) or any(a.get("cma") for a in local.values()):
            self._connect_cma(local)
        for host, addr in local.items():
            if host not in self.endpoints:
                self.endpoints[host] = self._ucx().connect(addr["worker"])
        for host in (h for h in remote if h > self.host):
            if peers[host]["tcp"] is None:
                raise ExecutionError(
                    f"agent {host!r} is on another node but has no UCX TCP listener (start it with --ucx-ip)"
                )
            self.endpoints[host] = self._ucx().connect_tcp(*peers[host]["tcp"])
        for _ in (h for h in remote if h < self.host):
            if self.ucx_ip is None:
                raise ExecutionError(f"agent {self.host!r} must accept TCP peers but has no UCX listener (--ucx-ip)")
            ep = self._ucx().accept()
            if ep.remote_name not in remote or ep.remote_name in self.endpoints:
                raise ExecutionError(f"agent {self.host!r} accepted an unexpected peer {ep.remote_name!r}")
            self.endpoints[ep.remote_name] = ep
        return {h: ep.mode for h, ep in sorted(self.endpoints.items())}

    def _connect_cma(self, local: Mapping[str, Mapping[str, Any]]) -> None:
        """Connect the peers on this machine over `CmaPeer`s (`cma.pair`); every agent must use them."""
        peer = self._peer()
        other = sorted(h for h, a in local.items() if bool(a.get("cma")) != getattr(peer, "takes_views", False))
        if other:
            raise ExecutionError(f"agent {self.host!r} and agent(s) {other} on its machine use different transports "
                                 "(cross memory attach and UCX); start them alike")  # fmt: skip
        from tenplex.runtime.transport import cma

        self.endpoints.update(cma.pair(peer, self.host, {h: a["cma"] for h, a in local.items()}))

    def load(self, job: str, tag: str, arrays: Mapping[Instance, np.ndarray], values: Mapping | None = None) -> int:
        """Put a state into `/job/<job>/<tag>` (replacing it); returns the bytes stored."""
        if self.store.exists(tag_path(job, tag)):
            self.store.delete(tag_path(job, tag))
        for (sid, device), array in arrays.items():
            self.store.put(array_path(job, tag, device, sid), array)  # put copies (keeping 0-d arrays 0-d)
        for (pid, device), named in (values or {}).items():
            for name, value in named.items():
                self.store.put(value_path(job, tag, device, pid, name), value)
        return self.store.nbytes(tag_path(job, tag)) if self.store.exists(tag_path(job, tag)) else 0

    def load_files(self, job: str, tag: str, arrays: Mapping[Instance, list], values: Mapping | None = None) -> int:
        """`load` from local `.npy` files ({instance: [path, dtype, shape]}), mapped, not read."""
        self.load(job, tag, {}, values)
        return local_files.map_files(self.store, job, tag, arrays)

    def prepare(self, job: str, src_tag: str, dst_tag: str, slice: dict | None = None, meta: dict | None = None,
                run: dict | None = None, slice_id: str | None = None, files: list | None = None) -> dict[str, Any]:  # fmt: skip
        """Decode this host's slice of the plan (or take the one sent earlier on this connection
        under `slice_id`), check the src arrays it reads exist and the dst tag does not, create
        its dst arrays (in one shared arena; those named in `files`, `[sub-tensor, device, path]`
        rows, as new memory-mapped `.npy` files, `agent.files.create_mapped`) and the tag's `meta`
        records under staging; then `run(**run)` if given. Returns {"gives": {op id: src value
        other hosts' value ops copy}, "prepare_s": seconds, "sent": bytes (after a run)}."""
        t0 = time.perf_counter()
        self._finish()
        ex = Execution(self.host, job, src_tag, dst_tag, self._sliced(slice, slice_id))
        if self.store.exists(tag_path(job, dst_tag)):
            raise ExecutionError(f"dst tag {tag_path(job, dst_tag)} already exists")
        if self.store.exists(tag_path(job, ex.staging)):
            self.store.delete(tag_path(job, ex.staging))
        sources = rounds.sources(self.store, ex.sliced, job, src_tag)
        devices = sorted({d for side, _, d, _, _ in ex.meta if side == "dst"})
        self.store.put(f"{tag_path(job, ex.staging)}/.manifest", {"host": self.host, "devices": devices})
        for name, value in (meta or {}).items():
            self.store.put(meta_path(job, ex.staging, name), value)
        made, ex.pending, ex.places = local_files.dst_arrays(self.store, ex, {(sid, d): path for sid, d, path in files or []}, self.pool)
        ex.arrays = [sources[i] if side == "src" else made[i] for i, (side, *_) in enumerate(ex.meta)]
        out = {"gives": rounds.src_values(self.store, job, src_tag, ex.sliced.gives)}
        self.execution = ex
        out["prepare_s"] = time.perf_counter() - t0
        if run is not None:
            out["sent"] = self.run(**run)
        return out

    def forget_slices(self) -> None:
        """Drop the kept slices and peers' answers to this agent's offers (a runtime's connection ended)."""
        self.slices.clear()
        self.maps.forget_peers()

    def reserve(self, nbytes: int) -> dict[str, Any]:
        """Fault in `nbytes` for later dst arrays now (the arena pool); returns {"pooled": bytes
        (0: no pool), "arenas": [pid, fd, inode, device, size] of each pooled arena, for `premap`}."""
        if self.pool is None:
            return {"pooled": 0, "arenas": []}
        self.pool.reserve(nbytes)
        arenas = [[os.getpid(), fd, (st := os.fstat(fd)).st_ino, st.st_dev, size] for fd, size in self.pool.arenas()]
        return {"pooled": self.pool.nbytes, "arenas": arenas}

    def premap(self, arenas: Mapping[str, list[list[int]]]) -> int:
        """Map the pooled arenas of peers on this node ({host: its `reserve`'s arenas}; others are
        left alone) ahead of the execution that offers them (`direct`); returns the bytes mapped."""
        same = [a for h, mine in arenas.items() if h in self.endpoints and self.endpoints[h].mode == "address" for a in mine]
        return self.maps.premap(same)

    def run(self, epoch: int = 0, later: list[int] | None = None) -> int:
        """Run every round of the prepared slice (`later`: ids of value ops whose src value another
        host reads: they wait for it until `commit`; `epoch` tells this execution's UCX tags from
        earlier ones'); returns the bytes this host sent."""
        ex = self._execution()
        if ex.done:
            raise ExecutionError("the prepared execution already ran")
        ex.waiting = set(later or ())
        return rounds.run(ex, self.store, self._peer, self._endpoint, self.scratch, epoch % 256, self.maps)

    def commit(self, job: str, dst_tag: str, values: Mapping[int, Any] | None = None) -> dict[str, float]:
        """Write `values` ({op id: src value} another host read) for the value ops waiting since
        `run`, then make the dst tag visible (rename staging); returns the execution's seconds per
        activity and the bytes it sent by a copy into same-node peers' memory (`direct_bytes`) and
        through the transport, UCX or cma (`transport_bytes`), and the bytes of peers' memory it
        mapped anew, page tables filled, to copy into (`mapped_bytes`). Raises ExecutionError, nothing
        renamed, before the rounds ran or when a waiting op gets no value or a value no op."""
        ex = self._execution()
        if (ex.job, ex.dst_tag) != (job, dst_tag):
            raise ExecutionError(f"commit of {job}/{dst_tag} but the prepared execution is {ex.job}/{ex.dst_tag}")
        if ex.done < ex.rounds:
            raise ExecutionError(f"commit of {job}/{dst_tag} before its rounds ran ({ex.done} of {ex.rounds})")
        rounds.late_values(ex, self.store, values or {})
        self._finish()
        self.store.rename(tag_path(job, ex.staging), tag_path(job, dst_tag))
        return {**ex.seconds, **ex.sent}

    def abort(self, job: str, dst_tag: str) -> bool:
        """Drop the staging tag (if any); True if there was one. Peers are asked again whether
        they map this agent's offers (`direct`): the failed execution may have ended theirs early."""
        self._finish()
        self.maps.forget_peers()
        path = tag_path(job, staging_tag(dst_tag))
        if self.store.exists(path):
            self.store.delete(path)
            return True
        return False

    def _finish(self) -> None:
        """Forget the current execution (the scratch pool, its pages touched, is kept)."""
        self.execution = None

    def serve_rest(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve this agent's store over the REST API (`rest.serve`) from a thread; returns its URL."""
        from tenplex.runtime.rest import serve

        if self.rest is None:
            self.rest = serve(self.store, host, port, token)
        return self.rest.url

    def rest_url(self) -> str | None:
        return None if self.rest is None else self.rest.url

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop()
        self._finish()
        self.scratch.release()
        self.maps.close()
        if self.pool is not None:
            self.pool.clear()
        if self.rest is not None:
            self.rest.stop()
        if self.peer is not None:
            self.peer.shutdown()
        self.store.close()

    # ---- execution -------------------------------------------------------------------
    def _execution(self) -> Execution:
        if self.execution is None:
            raise ExecutionError("no prepared execution (prepare first)")
        return self.execution

    def _endpoint(self, host: str) -> Any:
        if host not in self.endpoints:
            raise ExecutionError(f"not connected to host {host!r} (connected: {sorted(self.endpoints)})")
        return self.endpoints[host]
