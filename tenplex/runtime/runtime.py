"""`Runtime`: drives one agent per host through a plan, round by round, and commits atomically.

`Runtime.local(hosts)` starts one agent process per host name (`spawn` context), collects their
UCX worker addresses and connects every agent to every other. `execute(plan, src, dst, job,
src_tag, dst_tag)` then:

1. sends every agent its slice of the plan (`compiler.emit.slices`, built once per plan; only
   its id where the agent has it: `stage(plan, src, dst)` slices and hands the slices out ahead;
   `prepare`: checks, dst arrays under the staging tag `/job/<job>/.staging-<dst_tag>`) and has
   it run all its rounds in the same command (no barrier before or between rounds; agents wait
   only on the messages they receive), and waits for all of them;
2. commits on every agent (a store rename of staging to the dst tag) only if every agent
   finished every round, passing on with the commit the src values that value ops copy from
   other hosts (read by their hosts in `prepare`; those ops wait for them, `Agent.commit`).

On any failure (an agent raised, died, or missed the deadline) it aborts everywhere (staging
deleted; the src tag is never written) and raises `ExecutionError` listing each failed host with
its reason, in the order the failures arrived, so the first one is the cause and later ones are
usually peers timing out on it. An agent that misses a deadline, or sends no heartbeat for
`liveness` seconds (stopped or hung), is killed: its reply would arrive out of order. Every
call to an agent has a deadline, and `close` returns within seconds whatever the agents do, so
Ctrl-C ends a runtime promptly. Device -> host comes from the PTCs' topology; every host there
needs an agent. The control wire carries typed frames, never pickles (`agent.wire`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from tenplex.compiler.central import CentralPlan
from tenplex.compiler.plan import Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.agent import client, slicing
from tenplex.runtime.agent.client import LIVENESS_S, AgentFailures, AgentHandle, Clock
from tenplex.runtime.agent.server import TOKEN_ENV
from tenplex.runtime.store.layout import Instance, staging_tag, tag_path


class Runtime:
    def __init__(self, agents: Mapping[str, AgentHandle], round_timeout: float = 600.0, liveness: float = LIVENESS_S):
        self.agents = dict(agents)
        self.round_timeout = round_timeout
        self.liveness = liveness  # seconds an agent may send neither a heartbeat nor a reply
        self.phases: dict[str, float] = {}  # seconds per phase of the last `execute`
        self.host_seconds: dict[str, dict[str, float]] = {}  # per host, last `execute`: `Agent.commit`'s
        self.links: dict[str, dict[str, str]] = {}  # per host: {peer: "address" (shared memory) or "tcp"}
        self._sliced = slicing.Slices()  # the last plans' slices
        self._epoch = 0  # executions so far: tells one execution's UCX tags from the last one's

    @classmethod
    def local(cls, hosts: Iterable[str], timeout: float = 30.0, round_timeout: float = 600.0,
              start_timeout: float = 60.0, liveness: float = LIVENESS_S, local_dir: str | None = None,
              link: bool = True, fork: bool = False, transport: str = "ucx") -> Runtime:  # fmt: skip
        """One agent process per host on this machine, all connected (UCX shared memory).
        `timeout` bounds each UCX wait inside agents; `round_timeout` each round barrier;
        `liveness` how long an agent may stay silent (no heartbeat) before it is taken for dead;
        `local_dir`: each agent also serves its store to local processes on `local_dir/<host>.store`.
        `link=False` returns once the processes are started (`link()` connects them later).
        `fork=True`: forked where safe, importing nothing (`client.fork_safe`), else spawned.
        `transport="cma"`: agents read each other's memory (`transport.cma`), no UCX loaded."""
        rt = cls({}, round_timeout, liveness)
        with rt._closed_on_error("starting agents"):
            client.spawn_local(rt.agents, hosts, timeout, local_dir, fork, transport)
            if link:
                rt._link(start_timeout)
        return rt

    @classmethod
    def connect(cls, agents: Mapping[str, str], token: str | None = None, round_timeout: float = 600.0,
                start_timeout: float = 60.0, liveness: float = LIVENESS_S) -> Runtime:  # fmt: skip
        """Connect to running `tenplex agent`s ({host: control address}) and link them to each other
        (shared memory on one node, UCX over TCP between nodes). Closing the runtime leaves them running.
        `token` is the agents' control token (`$TENPLEX_AGENT_TOKEN` when None).

        Raises: ExecutionError naming the host that cannot be reached or that has another name."""
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        rt = cls({}, round_timeout, liveness)
        with rt._closed_on_error("connecting to agents"):
            names = {}
            for host, address in agents.items():
                channel, names[host] = client.connect(address, token, start_timeout)
                rt.agents[host] = AgentHandle(host, None, channel)
            wrong = {h: n for h, n in names.items() if n != h}
            if wrong:
                raise ExecutionError(f"agents answer with other names than asked: {wrong}")
            rt._link(start_timeout)
        return rt

    @contextlib.contextmanager
    def _closed_on_error(self, what: str) -> Iterator[None]:
        """Close every agent if the block fails; an agent's failure becomes an ExecutionError."""
        try:
            yield
        except BaseException as e:
            self.close()
            if isinstance(e, AgentFailures):
                raise ExecutionError(f"{what} failed: {e}") from None
            raise

    def link(self, timeout: float = 60.0) -> None:
        """Connect agents started with `local(link=False)`. Raises ExecutionError (agents closed)."""
        with self._closed_on_error("starting agents"):
            self._link(timeout)

    def _link(self, timeout: float) -> None:
        """Collect the agents' addresses and connect them. Agents we just spawned may still be
        importing (seconds on a loaded machine) before they can beat: silence is bounded by the
        start timeout here, not by `liveness`."""
        hosts = list(self.agents)
        silence = max(self.liveness, timeout)
        addresses = self._all({h: ("address", {}) for h in hosts}, timeout, liveness=silence)
        self.links = self._all({h: ("connect", {"peers": addresses}) for h in hosts}, timeout, liveness=silence)

    # ---- single-agent calls ------------------------------------------------------------
    def call(self, host: str, name: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """Run one command on one agent; raises ExecutionError naming the host on failure."""
        try:
            return self._all({host: (name, kwargs)}, timeout or self.round_timeout)[host]
        except AgentFailures as e:
            raise ExecutionError(str(e)) from None

    def load(self, job: str, tag: str, ptc: PTC, arrays: Mapping[Instance, np.ndarray],
             values: Mapping[tuple[str, int], dict] | None = None, command: str = "load") -> None:  # fmt: skip
        """Split a state by the host of each device (from `ptc.topology`) and load it under `tag`
        on every host, all or nothing: each host loads into a staging tag, and only when every host
        has it is staging renamed to `tag` (replacing an older `tag`). Raises ExecutionError; then
        no host has any of the new state and an older `tag` is untouched. `command="load_files"`: `arrays`
        are local `.npy` files ({instance: (path, dtype, shape)}) that the hosts map (`agent.files`)."""
        per_host = client.by_host(self.agents, ptc.topology.host_of, arrays, values or {})
        staging = staging_tag(tag)
        calls = {h: (command, {"job": job, "tag": staging, "arrays": a, "values": v}) for h, (a, v) in per_host.items()}
        try:
            self._all(calls, self.round_timeout)
            self._all({h: ("rename_tag", {"job": job, "src": staging, "dst": tag}) for h in per_host}, self.round_timeout)
        except AgentFailures as e:
            self.drop(job, staging)
            raise ExecutionError(f"loading {tag_path(job, tag)} failed; no host kept any of it: {e}") from None

    def fetch(self, job: str, tag: str) -> tuple[dict[Instance, np.ndarray], dict[tuple[str, int], dict]]:
        """The state under a tag, merged over all agents (copies)."""
        arrays: dict = {}
        values: dict = {}
        for host in self.agents:
            a, v = self.call(host, "fetch", job=job, tag=tag)
            arrays.update(a)
            values.update(v)
        return arrays, values

    def tag_meta(self, job: str, tag: str) -> dict[str, Any]:
        """The `.meta` records of a tag ({name: record}), from the first host (by name) that has them."""
        for host in sorted(self.agents):
            found = self.call(host, "tag_meta", job=job, tag=tag)
            if found:
                return found
        return {}

    def alive(self, timeout: float = 10.0) -> dict[str, bool]:
        """Per host, whether its agent answers within `timeout` s (one that does not is lost)."""
        with contextlib.suppress(AgentFailures):
            self._all({h: ("name", {}) for h in self.agents}, timeout)
        return {h: a.dead is None for h, a in sorted(self.agents.items())}

    def forget(self, hosts: Iterable[str]) -> None:
        """Stop using the agents of `hosts` (lost ones): later calls and plans leave them out."""
        client.close_all({h: self.agents.pop(h) for h in list(hosts) if h in self.agents}, 1.0)

    def reserve(self, nbytes: int) -> dict[str, int]:
        """Have every agent fault in `nbytes` for later dst arrays now, and its same-node peers map
        them, off the clock of an execute (`Agent.reserve`, `Agent.premap`); returns the bytes each pooled."""
        got = self._all({h: ("reserve", {"nbytes": nbytes}) for h in self.agents})
        self._all({h: ("premap", {"arenas": {g: r["arenas"] for g, r in got.items() if g != h}}) for h in self.agents})
        return {h: r["pooled"] for h, r in got.items()}

    def exists(self, job: str, tag: str) -> dict[str, bool]:
        """Whether `/job/<job>/<tag>` exists, per host."""
        return {h: self.call(h, "exists", path=tag_path(job, tag)) for h in self.agents}

    # ---- execution ---------------------------------------------------------------------
    def execute(self, plan: Plan, src: PTC, dst: PTC, job: str, src_tag: str, dst_tag: str,
                on_round: Callable[[int, int], None] | None = None, meta: Mapping[str, Any] | None = None,
                files: Mapping[str, list] | None = None) -> dict[str, int]:  # fmt: skip
        """Run `plan` from `src_tag` to `dst_tag` on all agents; returns bytes sent per host.
        `on_round(done, total)` is called after each round (progress); `meta` ({name: JSON})
        is committed with the dst tag on every host, as its `.meta/<name>` records; `files` ({host:
        [(sub-tensor, device, path)]}): dst arrays that are new mapped local `.npy` files (`Agent.prepare`).

        Raises: ExecutionError naming the failed host(s) and message/op; then no host has the
        dst tag or its staging tag and the src tag is unchanged.
        """
        topology = src.topology.union(dst.topology)
        needed = set(topology.hosts) | {h for m in plan.messages for h in (m.src_host, m.dst_host)}
        missing = sorted(needed - set(self.agents))
        if missing:
            raise ExecutionError(f"no agent for host(s) {missing} (agents: {sorted(self.agents)})")
        hosts = sorted(self.agents)
        clock = Clock(self.phases)
        what = f"executing the plan ({tag_path(job, src_tag)} -> {tag_path(job, dst_tag)})"
        slices, sid = self._sliced.of(plan, src, dst, hosts, what)
        self._epoch += 1
        progress = client.Progress(hosts, total := slices[hosts[0]]["rounds"] if hosts else 0, on_round)
        sending = [h for h in hosts if sid not in self.agents[h].kept]  # the others have it (`stage`, an earlier execute)
        try:  # no host waits for another before its rounds: values read on other hosts come with the commit
            later = slicing.values_later(slices)
            prepared = self._all({h: ("prepare", {"job": job, "src_tag": src_tag, "dst_tag": dst_tag, "meta": dict(meta or {}),
                                                  "slice": slices[h] if h in sending else None, "slice_id": sid,
                                                  "run": {"epoch": self._epoch, "later": later.get(h, [])},
                                                  "files": [list(f) for f in (files or {}).get(h, [])]})
                                  for h in hosts}, self.round_timeout * max(1, total), on_beat=progress.beat)  # fmt: skip
            for h in sending:  # each agent keeps the slice: executing this plan again sends only its id
                slicing.sent(self.agents[h], sid)
            clock.lap("prepare")  # the agents' own prepare seconds, the rest is rounds
            clock.phases["rounds"] = clock.phases["prepare"] - max((p["prepare_s"] for p in prepared.values()), default=0.0)
            clock.phases["prepare"] -= clock.phases["rounds"]
            sent = {h: p["sent"] for h, p in prepared.items()}
            values = slicing.passed_values(slices, prepared)
            progress.finish()
            self.host_seconds = self._all({h: ("commit", {"job": job, "dst_tag": dst_tag, "values": values.get(h, {})})
                                           for h in hosts})  # fmt: skip
            clock.lap("commit")
        except AgentFailures as e:
            slicing.forget(self.agents.values())
            self._abort(job, dst_tag)
            raise ExecutionError(f"{what} failed and nothing was committed: {e}") from None
        return sent

    def stage(self, plan: Plan | CentralPlan, src: PTC, dst: PTC) -> None:
        """Slice `plan` (both of a `CentralPlan`) and hand every agent its slice now, not at the
        start of its `execute`, which then sends only the slice's id (`slicing`; TP 2->4, 4 hosts:
        ~10 CPU ms of slicing, ~4 of encoding, ~4 of a sender's decoding off the execute's clock).
        Raises: ExecutionError (nothing executed) when the plan cannot be sliced or an agent fails."""
        hosts = sorted(self.agents)
        pairs = ((plan.gather, src, plan.mid), (plan.scatter, plan.mid, dst)) if isinstance(plan, CentralPlan) else ((plan, src, dst),)
        for p, a, b in pairs:
            try:
                slicing.hand_out(self.agents, *self._sliced.of(p, a, b, hosts, "staging the plan"), self._all)
            except AgentFailures as e:
                raise ExecutionError(f"staging the plan failed (nothing was executed): {e}") from None

    def execute_central(self, central: CentralPlan, src: PTC, dst: PTC, job: str, src_tag: str,
                        dst_tag: str) -> dict[str, int]:  # fmt: skip
        """The centralized baseline (`compile_central`): gather into a hidden tag on the central
        host, scatter from it to `dst_tag`, then drop the hidden tag. Same guarantees as `execute`;
        `phases` holds both executions' sums."""
        mid_tag = f".central-{dst_tag}"
        phases: dict[str, float] = {}
        try:
            gathered = self.execute(central.gather, src, central.mid, job, src_tag, mid_tag)
            phases.update({f"gather {k}": v for k, v in self.phases.items()})
            scattered = self.execute(central.scatter, central.mid, dst, job, mid_tag, dst_tag)
            phases.update({f"scatter {k}": v for k, v in self.phases.items()})
        finally:
            self.drop(job, mid_tag)
            self.phases = phases
        return {h: gathered.get(h, 0) + scattered.get(h, 0) for h in self.agents}

    def memory(self, reset_peak: bool = False) -> dict[str, dict[str, int]]:
        """Per host: {"rss", "peak"} resident bytes of its agent (`reset_peak` restarts the peak)."""
        try:
            return self._all({h: ("memory", {"reset_peak": reset_peak}) for h in self.agents}, 30.0)
        except AgentFailures as e:
            raise ExecutionError(f"reading agent memory failed: {e}") from None

    def drop(self, job: str, tag: str) -> None:
        """Delete `/job/<job>/<tag>` on every live agent that has it."""
        live = [h for h, a in self.agents.items() if a.dead is None]
        with contextlib.suppress(AgentFailures):
            self._all({h: ("delete_tag", {"job": job, "tag": tag}) for h in live}, min(self.round_timeout, 60.0))

    def _abort(self, job: str, dst_tag: str) -> None:
        live = [h for h, a in self.agents.items() if a.dead is None]
        with contextlib.suppress(AgentFailures):  # agents that cannot abort were killed by `_all`, staging with them
            self._all({h: ("abort", {"job": job, "dst_tag": dst_tag}) for h in live}, min(self.round_timeout, 30.0))

    # ---- calls to agents --------------------------------------------------------------
    def _all(self, calls: Mapping[str, tuple[str, dict]], timeout: float | None = None,
             on_beat: Callable[[str, dict], None] | None = None, liveness: float | None = None) -> dict[str, Any]:  # fmt: skip
        """`call_all` with the round timeout and `self.liveness` by default (raises AgentFailures)."""
        return client.call_all(self.agents, calls, self.round_timeout if timeout is None else timeout,
                               self.liveness if liveness is None else liveness, on_beat)  # fmt: skip

    def _host(self, host: str) -> str:
        return client.agent_of(self.agents, host).host

    # ---- shutdown ----------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop every agent (asking first, killing after `timeout`). Idempotent."""
        client.close_all(self.agents, timeout)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
