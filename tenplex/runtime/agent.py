"""A per-host agent: owns the host's `TensorStore` and `UcxPeer` and executes its share of a plan.

The agent obeys commands from a runtime; `agent_main` runs it as a process (spawned by
`Runtime.local`, or `tenplex agent` listening for runtimes). A command is `(name, kwargs)`;
every reply is `("ok", result)` or `("err", text)`, the text naming the command and, where
known, the message and op that failed (the runtime adds the host). Commands: `name`,
`address`, `connect`, `load`, `prepare`, `values`, `run_round`, `commit`, `abort`, `fetch`,
`delete_tag`, `exists`, `memory`, `rest_url`, `stop`.

Store layout (one store per host):

    /job/<job>/<tag>/<device>/<subtensor id>               array of a sub-tensor instance
    /job/<job>/<tag>/<device>/.values/<partition>/<name>   typed value of a partition instance
    /job/<job>/<tag>/.manifest                             {"host", "devices"} (dst tags only)
    /job/<job>/.staging-<dst tag>/...                      the dst tag being built

Sub-tensor ids contain `/` (`<partition>/<path>`), so they nest as directories. Execution:
`prepare` parses the plan and PTCs (JSON), checks the src instances this host reads exist and the
dst tag does not, and creates zeroed dst arrays (pages touched) under the staging tag.
`run_round(r)` runs fills and values first (round 0), then the round's messages touching this
host: local ones region to region, then every network message of the round posted at once to
all peers (`UcxPeer.exchange`: no ordering between them, so no deadlock and every link busy),
direct parts zero-copy and the rest through the scratch pool (`parts`). The plan's schedule
bounds a round's bytes per host, and so the scratch pool. `commit` renames staging to the dst
tag in one store step; `abort` deletes staging. The src tag is only ever read.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Message, Plan, plan_from_json
from tenplex.ir.box import Box
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import ptc_from_json
from tenplex.runtime import parts
from tenplex.runtime.arrays import np_dtype, view
from tenplex.runtime.executor import pack, source_region, target_region, unpack
from tenplex.runtime.store import TensorStore

Instance = tuple[str, int]  # (sub-tensor id, device)


# ---- store layout ------------------------------------------------------------------------
def tag_path(job: str, tag: str) -> str:
    return f"/job/{job}/{tag}"


def staging_tag(dst_tag: str) -> str:
    return f".staging-{dst_tag}"


def array_path(job: str, tag: str, device: int, subtensor: str) -> str:
    return f"{tag_path(job, tag)}/{device}/{subtensor}"


def value_path(job: str, tag: str, device: int, partition: str, name: str) -> str:
    return f"{tag_path(job, tag)}/{device}/.values/{partition}/{name}"


def parse_leaf(job: str, tag: str, path: str) -> tuple[str, Any] | None:
    """("array", (subtensor, device)) or ("value", (partition, device, name)) for a leaf of a tag."""
    rest = path[len(tag_path(job, tag)) + 1 :].split("/")
    if len(rest) < 2 or not rest[0].isdigit():
        return None
    device = int(rest[0])
    if rest[1] == ".values":
        return "value", ("/".join(rest[2:-1]), device, rest[-1])
    return "array", ("/".join(rest[1:]), device)


# ---- the agent ---------------------------------------------------------------------------
class _Execution:
    """One plan being executed by this host: parsed plan, PTCs, and views of its arrays."""

    def __init__(self, host: str, job: str, src_tag: str, dst_tag: str, plan: Plan, src: PTC, dst: PTC):
        self.host, self.job, self.src_tag, self.dst_tag = host, job, src_tag, dst_tag
        self.plan, self.src, self.dst = plan, src, dst.with_allocation(plan.allocation)
        self.topology = src.topology.union(dst.topology)
        self.host_of = self.topology.host_of
        self.staging = staging_tag(dst_tag)
        self.src_arrays: dict[Instance, np.ndarray] = {}
        self.dst_arrays: dict[Instance, np.ndarray] = {}
        self.rounds_done: set[int] = set()
        self.seconds: dict[str, float] = {}  # time per activity: local, pack, exchange, unpack
        self.first_round: dict[Instance, int] = {}  # dst array -> the first round that writes it
        self.prefaulter: parts.Prefaulter | None = None

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0


def node_id() -> str:
    """This machine and network namespace: agents with equal ids can use shared memory."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return f"{boot}/net:{os.stat('/proc/self/ns/net').st_ino}"


class Agent:
    """One host's store and UCX worker. `ucx_ip` (with `ucx_port`, 0 = any) opens a UCX TCP
    listener on that address for agents on other nodes."""

    def __init__(self, host: str, timeout: float = 30.0, ucx_ip: str | None = None, ucx_port: int = 0):
        self.host, self.timeout = host, timeout
        self.ucx_ip, self.ucx_port = ucx_ip, ucx_port
        self.store = TensorStore()
        self.peer: Any = None
        self.endpoints: dict[str, Any] = {}
        self.execution: _Execution | None = None
        self.scratch = parts.Scratch()  # pack and landing buffers, reused round after round
        self.rest: Any = None

    def _ucx(self) -> Any:
        if self.peer is None:
            from tenplex.runtime.transport.ucx import UcxPeer  # only agents need UCX

            self.peer = UcxPeer(self.host, timeout=self.timeout)
        return self.peer

    # ---- commands --------------------------------------------------------------------
    def name(self) -> str:
        return self.host

    def address(self) -> dict[str, Any]:
        """How peers reach this agent: {"worker": UCX worker address, "node": machine and network
        namespace, "tcp": [ip, port] of the UCX listener or None}."""
        peer = self._ucx()
        tcp = [self.ucx_ip, peer.listen(self.ucx_port)] if self.ucx_ip is not None else None
        return {"worker": peer.address, "node": node_id(), "tcp": tcp}

    def connect(self, peers: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Connect to every other agent in `peers` ({host: its `address()`}); returns {host: mode}.

        Same node: shared memory (worker address, both directions). Other nodes: UCX over TCP; an
        agent dials the hosts named after it and then accepts the ones named before it, so the
        dialling order has no cycle and every pair connects once."""
        me = node_id()
        remote = sorted(h for h, a in peers.items() if h != self.host and h not in self.endpoints and a["node"] != me)
        for host, addr in sorted(peers.items()):
            if host != self.host and host not in self.endpoints and addr["node"] == me:
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

    def load(self, job: str, tag: str, arrays: Mapping[Instance, np.ndarray], values: Mapping | None = None) -> int:
        """Put a state into `/job/<job>/<tag>` (replacing it); returns the bytes stored."""
        if self.store.exists(tag_path(job, tag)):
            self.store.delete(tag_path(job, tag))
        for (sid, device), array in arrays.items():
            self.store.put(array_path(job, tag, device, sid), np.ascontiguousarray(array))
        for (pid, device), named in (values or {}).items():
            for name, value in named.items():
                self.store.put(value_path(job, tag, device, pid, name), value)
        return self.store.nbytes(tag_path(job, tag)) if self.store.exists(tag_path(job, tag)) else 0

    def prepare(self, job: str, src_tag: str, dst_tag: str, plan: dict, src: dict, dst: dict) -> int:
        """Parse the plan, check inputs, create zeroed dst arrays under staging; returns dst bytes."""
        self._finish()
        ex = _Execution(self.host, job, src_tag, dst_tag, plan_from_json(plan), ptc_from_json(src), ptc_from_json(dst))
        if self.store.exists(tag_path(job, dst_tag)):
            raise ExecutionError(f"dst tag {tag_path(job, dst_tag)} already exists")
        if self.store.exists(tag_path(job, ex.staging)):
            self.store.delete(tag_path(job, ex.staging))
        mine = set(ex.topology.devices_on(self.host))
        for i, op in enumerate(ex.plan.ops):
            if isinstance(op, CopyOp) and op.src_side == "src" and op.src_device in mine:
                key = (op.src_subtensor, op.src_device)
                if key not in ex.src_arrays:
                    path = array_path(job, src_tag, op.src_device, op.src_subtensor)
                    if not self.store.exists(path):
                        raise ExecutionError(f"op {i}: src array {path} is missing")
                    ex.src_arrays[key] = self.store.get(path)
        devices = sorted(d for d in ex.dst.allocation.devices if d in mine)
        self.store.put(f"{tag_path(job, ex.staging)}/.manifest", {"host": self.host, "devices": devices})
        for st in ex.dst.subtensors:
            for d in ex.dst.devices_of_subtensor(st.id):
                if d in mine:
                    path = array_path(job, ex.staging, d, st.id)
                    self.store.create(path, st.shape, ex.dst.tensor_map[st.tensor].dtype)
                    ex.dst_arrays[(st.id, d)] = self.store.read(path, Box.from_shape(st.shape), writable=True)
        ex.first_round = _first_rounds(ex)
        # UCX writing into untouched pages is ~2x slower: fault them in ahead of their round
        ordered = sorted(ex.dst_arrays, key=lambda k: ex.first_round.get(k, 0))
        ex.prefaulter = parts.Prefaulter([(k, ex.dst_arrays[k]) for k in ordered])
        self.execution = ex
        return sum(a.nbytes for a in ex.dst_arrays.values())

    def values(self, job: str, tag: str, wanted: list[tuple[int, str, int, str]]) -> dict[int, Any]:
        """{op id: value} for (op id, partition, device, name) of values this host holds."""
        out = {}
        for op_id, pid, device, name in wanted:
            path = value_path(job, tag, device, pid, name)
            if not self.store.exists(path):
                raise ExecutionError(f"value op {op_id}: src value {path} is missing")
            out[op_id] = self.store.get(path)
        return out

    def run_round(self, round: int, values: Mapping[int, Any] | None = None) -> int:
        """Run this host's share of round `round`; returns the bytes it sent."""
        ex = self._execution()
        if round in ex.rounds_done:
            raise ExecutionError(f"round {round} already ran")
        if ex.prefaulter is not None:
            ex.prefaulter.claim(k for k, r in ex.first_round.items() if r <= round)
        if round == 0:
            self._fills_and_values(ex, values or {})
        sent = 0
        messages = sorted((m for m in ex.plan.messages if m.round == round), key=lambda m: m.id)
        with ex.timed("local"):
            for m in messages:
                if m.src_host == m.dst_host == self.host:
                    self._guard(ex, m, lambda m=m: self._local(ex, m))
        sent = self._network(
            ex, [m for m in messages if m.src_host != m.dst_host and self.host in (m.src_host, m.dst_host)]
        )
        ex.rounds_done.add(round)
        return sent

    def commit(self, job: str, dst_tag: str) -> dict[str, float]:
        """Make the dst tag visible (rename staging); returns the execution's seconds per activity."""
        ex = self._execution()
        if (ex.job, ex.dst_tag) != (job, dst_tag):
            raise ExecutionError(f"commit of {job}/{dst_tag} but the prepared execution is {ex.job}/{ex.dst_tag}")
        self._finish()
        self.store.rename(tag_path(job, ex.staging), tag_path(job, dst_tag))
        return ex.seconds

    def abort(self, job: str, dst_tag: str) -> bool:
        """Drop the staging tag (if any); True if there was one."""
        self._finish()
        path = tag_path(job, staging_tag(dst_tag))
        if self.store.exists(path):
            self.store.delete(path)
            return True
        return False

    def _finish(self) -> None:
        """Forget the current execution and stop its prefaulter. The scratch pool (at most one
        round's packed bytes) is kept for the next execution: its pages are already touched."""
        if self.execution is not None and self.execution.prefaulter is not None:
            self.execution.prefaulter.stop()
        self.execution = None

    def fetch(self, job: str, tag: str) -> tuple[dict[Instance, np.ndarray], dict[tuple[str, int], dict[str, Any]]]:
        """Copies of every array and value under a tag: ({(subtensor, device): array}, {(partition, device): values})."""
        arrays: dict[Instance, np.ndarray] = {}
        values: dict[tuple[str, int], dict[str, Any]] = {}
        if not self.store.exists(tag_path(job, tag)):
            return arrays, values
        for path in self.store.walk(tag_path(job, tag)):
            parsed = parse_leaf(job, tag, path)
            if parsed is None:
                continue
            kind, key = parsed
            if kind == "array":
                arrays[key] = np.array(self.store.get(path))
            else:
                values.setdefault(key[:2], {})[key[2]] = self.store.get(path)
        return arrays, values

    def memory(self, reset_peak: bool = False) -> dict[str, int]:
        """This process's resident bytes now and at peak (Linux VmRSS/VmHWM); `reset_peak`
        restarts the peak from now (/proc/self/clear_refs), to measure one execution."""
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(rest.split()[0]) * 1024
        return {"rss": fields["VmRSS"], "peak": fields["VmHWM"]}

    def delete_tag(self, job: str, tag: str) -> bool:
        """Delete `/job/<job>/<tag>` if present; True if it was."""
        if self.store.exists(tag_path(job, tag)):
            self.store.delete(tag_path(job, tag))
            return True
        return False

    def exists(self, path: str) -> bool:
        return self.store.exists(path)

    def serve_rest(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve this agent's store over the REST API (`rest.serve`) from a thread; returns its URL."""
        from tenplex.runtime.rest import serve

        if self.rest is None:
            self.rest = serve(self.store, host, port, token)
        return self.rest.url

    def rest_url(self) -> str | None:
        return None if self.rest is None else self.rest.url

    def stop(self) -> None:
        self._finish()
        self.scratch.release()
        if self.rest is not None:
            self.rest.stop()
        if self.peer is not None:
            self.peer.shutdown()
        self.store.close()

    # ---- execution -------------------------------------------------------------------
    def _execution(self) -> _Execution:
        if self.execution is None:
            raise ExecutionError("no prepared execution (prepare first)")
        return self.execution

    def _guard(self, ex: _Execution, m: Message, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:
            ops = list(m.ops)
            raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}, round {m.round}, ops {ops[:4]}"
                                 f"{'...' if len(ops) > 4 else ''}) failed: {type(e).__name__}: {e}") from e  # fmt: skip

    def _fills_and_values(self, ex: _Execution, values: Mapping[int, Any]) -> None:
        for i, op in enumerate(ex.plan.ops):
            if isinstance(op, (FillOp, ValueOp)) and ex.host_of(op.dst_device) == self.host:
                try:
                    if isinstance(op, FillOp):
                        view(ex.dst_arrays[(op.dst_subtensor, op.dst_device)], op.box)[...] = op.value
                    else:
                        value = op.value if op.src_partition is None else values[i]
                        path = value_path(ex.job, ex.staging, op.dst_device, op.dst_partition, op.name)
                        self.store.put(path, value, replace=True)
                except Exception as e:
                    raise ExecutionError(
                        f"op {i} ({type(op).__name__} on device {op.dst_device}) failed: {type(e).__name__}: {e}"
                    ) from e

    def _local(self, ex: _Execution, m: Message) -> None:
        for i in m.ops:
            op = ex.plan.ops[i]
            try:
                _target(op, ex)[...] = _source(op, ex)
            except Exception as e:
                raise ExecutionError(f"op {i} (copy of {op.tensor!r} box {op.box}, device {op.src_device} -> "
                                     f"{op.dst_device}): {type(e).__name__}: {e}") from e  # fmt: skip

    def _network(self, ex: _Execution, messages: list[Message]) -> int:
        """Exchange this round's network messages with every peer at once; returns bytes sent.

        Direct parts go from src views into dst views; the rest of a message is packed into and
        unpacked from the scratch pool (see `parts`)."""
        if not messages:
            return 0
        sends: list = []
        recvs: list = []
        expect: list[tuple[Message, np.ndarray | None, list[CopyOp], int]] = []  # (message, packed buffer, ops, bytes)
        with ex.timed("pack"):
            layout = [(m, *parts.split([(i, ex.plan.ops[i]) for i in m.ops], ex.src, ex.dst)) for m in messages]
            with ex.timed("scratch"):
                self.scratch.reserve(sum(_nbytes(ops, ex) for _, _, ops in layout))
            for m, directs, packed in layout:
                outgoing = m.src_host == self.host
                ep = self._endpoint(m.dst_host if outgoing else m.src_host)
                region = _source if outgoing else _target
                for i, op in directs:
                    view_ = self._guard(ex, m, lambda op=op, region=region: region(op, ex))
                    (sends if outgoing else recvs).append((ep, view_, parts.DIRECT | i))
                    if not outgoing:
                        expect.append((m, None, [op], view_.nbytes))
                if packed:
                    buffer = self.scratch.take(_nbytes(packed, ex))
                    if outgoing:
                        self._guard(
                            ex, m, lambda p=packed, b=buffer: pack(p, ex.src, ex.dst, ex.src_arrays, ex.dst_arrays, b)
                        )
                        sends.append((ep, buffer, m.id))
                    else:
                        recvs.append((ep, buffer, m.id))
                        expect.append((m, buffer, packed, buffer.nbytes))
        try:
            with ex.timed("exchange"):
                got = self._ucx().exchange(sends, recvs)
        except Exception as e:
            ids = [m.id for m in messages]
            raise ExecutionError(f"round {messages[0].round}: exchanging messages {ids[:8]}{'...' if len(ids) > 8 else ''}"
                                 f" with peers failed: {type(e).__name__}: {e}") from e  # fmt: skip
        with ex.timed("unpack"):
            for (m, buffer, ops, nbytes), received in zip(expect, got):
                if received.data.nbytes != nbytes:
                    raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}): received "
                                         f"{received.data.nbytes} B for ops {ops[:1]}..., expected {nbytes} B")  # fmt: skip
                if buffer is not None:
                    self._guard(ex, m, lambda ops=ops, buffer=buffer: unpack(ops, ex.dst, ex.dst_arrays, buffer))
        return sum(p.nbytes for _, p, _ in sends)

    def _endpoint(self, host: str) -> Any:
        if host not in self.endpoints:
            raise ExecutionError(f"not connected to host {host!r} (connected: {sorted(self.endpoints)})")
        return self.endpoints[host]


def _source(op: CopyOp, ex: _Execution) -> np.ndarray:
    return source_region(op, ex.src, ex.dst, ex.src_arrays, ex.dst_arrays)


def _target(op: CopyOp, ex: _Execution) -> np.ndarray:
    return target_region(op, ex.dst, ex.dst_arrays)


def _first_rounds(ex: _Execution) -> dict[Instance, int]:
    """The first round writing each of this host's dst arrays (0 for arrays with fills)."""
    first: dict[Instance, int] = {}
    for m in ex.plan.messages:
        for i in m.ops:
            op = ex.plan.ops[i]
            key = (op.dst_subtensor, op.dst_device)
            if key in ex.dst_arrays:
                first[key] = min(first.get(key, m.round), m.round)
    for op in ex.plan.ops:
        if isinstance(op, FillOp) and (op.dst_subtensor, op.dst_device) in ex.dst_arrays:
            first[(op.dst_subtensor, op.dst_device)] = 0
    return first


def _nbytes(ops: list[CopyOp], ex: _Execution) -> int:
    """Bytes of the ops' boxes (their packed size)."""
    return sum(op.box.volume * np_dtype(ex.dst.tensor_map[op.tensor].dtype).itemsize for op in ops)
