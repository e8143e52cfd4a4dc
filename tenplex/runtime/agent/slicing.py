"""A runtime's per-host slices of its plans (`compiler.emit.slices`), made once per plan, and
which of them each agent keeps, so that an execute sends an agent only the id of a slice it has;
and the src values that the slices pass between hosts (`values_later`, `passed_values`).

Invariants: an agent handle's `kept` names only slices its agent keeps. The agent keeps the last
`sliced.SLICES_KEPT` slices sent on its connection, in the order they were sent (naming a kept
one does not reorder them); `sent` keeps the same order and limit. After a failure the runtime
`forget`s: which slices the agent kept is then unknown, and sending a slice again is always safe.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tenplex.compiler.emit.slices import host_slices
from tenplex.compiler.plan import Plan
from tenplex.ir.errors import ExecutionError, IRError
from tenplex.ir.ptc import PTC
from tenplex.runtime.agent.client import AgentFailures, AgentHandle
from tenplex.runtime.agent.sliced import SLICES_KEPT

SLICED_KEPT = 4  # plans whose slices a runtime keeps (`Runtime.stage`: a central plan is two)


class Slices:
    """The slices of a runtime's last SLICED_KEPT plans, each with an id unique to the runtime."""

    def __init__(self) -> None:
        self._made: dict[tuple, tuple[dict[str, dict], tuple, str]] = {}  # key: slices, objects, id
        self._ids = (f"{secrets.token_hex(6)}-{n}" for n in itertools.count())

    def of(self, plan: Plan, src: PTC, dst: PTC, hosts: list[str], what: str) -> tuple[dict[str, dict], str]:
        """Each host's slice of `plan` and their id, made once per plan (while kept).

        Raises: ExecutionError (nothing ran) when the plan cannot be sliced for `hosts`."""
        key = (id(plan), id(src), id(dst), tuple(hosts))
        if key not in self._made:
            try:
                slices = host_slices(plan, src, dst, hosts)
            except IRError as e:
                raise ExecutionError(f"{what} failed before anything ran (nothing was committed): {e}") from None
            while len(self._made) >= SLICED_KEPT:
                self._made.pop(next(iter(self._made)))
            self._made[key] = (slices, (plan, src, dst), next(self._ids))  # the objects kept: their ids stay theirs
        slices, _, sid = self._made[key]
        return slices, sid


def hand_out(agents: Mapping[str, AgentHandle], slices: dict[str, dict], slice_id: str,
             call: Callable[[dict[str, tuple[str, dict]]], Any]) -> None:
    """Send every agent that lacks it its slice (`keep_slice`) by `call` ({host: (command, args)}).
    Raises: AgentFailures (from `call`; then the agents' kept slices are forgotten)."""
    calls = {h: ("keep_slice", {"slice": slices[h], "slice_id": slice_id}) for h in slices if slice_id not in agents[h].kept}
    try:
        call(calls)
    except AgentFailures:
        forget(agents.values())
        raise
    for h in calls:
        sent(agents[h], slice_id)


def sent(agent: AgentHandle, slice_id: str) -> None:
    """`agent` was sent slice `slice_id` and keeps it (see the module's invariants)."""
    if slice_id in agent.kept:
        agent.kept.remove(slice_id)
    agent.kept.append(slice_id)
    del agent.kept[:-SLICES_KEPT]


def forget(agents: Iterable[AgentHandle]) -> None:
    """After a failure: the agents' kept slices are unknown, later executes send them again."""
    for agent in agents:
        agent.kept.clear()


def values_later(slices: Mapping[str, dict]) -> dict[str, list[int]]:
    """{host: ids of its value ops whose src value another host reads (its slice's `gives`)}:
    they wait for it until the commit (`Agent.run`'s `later`)."""
    out: dict[str, list[int]] = {}
    for sl in slices.values():
        for g in sl["gives"]:
            out.setdefault(g[4], []).append(g[0])
    return out


def passed_values(slices: Mapping[str, dict], prepared: Mapping[str, dict]) -> dict[str, dict[int, Any]]:
    """{dst host: {op id: value}}: the src values each host read for others (its slice's `gives`)."""
    dst_host = {g[0]: g[4] for sl in slices.values() for g in sl["gives"]}
    out: dict[str, dict[int, Any]] = {}
    for got in prepared.values():
        for i, v in got["gives"].items():
            out.setdefault(dst_host[i], {})[i] = v
    return out
