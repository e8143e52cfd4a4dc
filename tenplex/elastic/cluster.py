"""The hosts an elastic job runs on: this machine alone, or several hosts, each with an agent,
one torchrun node and a directory of its own (no filesystem shared between hosts).

`Cluster.local(job_dir)` is one node, this machine, whose directory is the job directory.
`Cluster.emulated(hosts, job_dir)` runs on `netns.EmulatedHosts`: node i is host `h<i>` with
the emulated host's address and interface, started inside its network namespace; node 0's
directory is the job directory (where the controller reads what rank 0 writes: the stop file,
`saved/gen-N/COMPLETE`, timings, metrics), node i's is `job_dir/hosts/h<i>`.

`place(world)` puts a generation's processes on the first nodes, `per_node` on each (the job's
`gpus_per_host`): rank 0 is always on node 0, ranks are numbered node by node, as torchrun's
`--node-rank` numbers them.

Invariants:
- node names are distinct; node 0's directory is the job directory;
- `place(world)` covers ranks 0..world-1 once, in order, on at most `len(nodes)` nodes.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import ElasticError


@attrs.frozen
class Node:
    name: str
    address: str  # where other nodes reach it (torchrun's master address when it is node 0)
    dir: Path  # its own job directory
    run: Callable[..., subprocess.Popen] = subprocess.Popen  # starts a process on it: run(argv, **popen_kwargs)
    iface: str | None = None  # the network interface gloo should use there
    index: int = 0  # its index among the emulated hosts (for `AgentFleet`)


@attrs.frozen
class Cluster:
    nodes: tuple[Node, ...]
    per_node: int = 1 << 30  # processes per node (the job's gpus_per_host for several nodes)
    hosts: Any = None  # the `netns.EmulatedHosts` the nodes are, or None for this machine alone

    @classmethod
    def local(cls, job_dir: str | Path) -> Cluster:
        return cls((Node("h0", "127.0.0.1", Path(job_dir)),))

    @classmethod
    def emulated(cls, hosts: Any, job_dir: str | Path, per_node: int = 1) -> Cluster:
        job_dir = Path(job_dir)
        nodes = []
        for i, h in enumerate(hosts.hosts):
            run = functools.partial(hosts.run, i)
            nodes.append(Node(f"h{i}", h.address, job_dir if i == 0 else job_dir / "hosts" / f"h{i}", run, h.iface, i))
        return cls(tuple(nodes), per_node, hosts)

    def without(self, names: set[str] | list[str]) -> Cluster:
        """The cluster without the nodes `names` (lost hosts). Raises ElasticError when that
        would lose the first node (the controller's, where rank 0 runs)."""
        if self.nodes[0].name in names:
            raise ElasticError(f"host {self.nodes[0].name} (the controller's, with rank 0) was lost; the job cannot continue")
        return attrs.evolve(self, nodes=tuple(n for n in self.nodes if n.name not in names))

    @property
    def multi(self) -> bool:
        return len(self.nodes) > 1

    def place(self, world: int) -> list[tuple[Node, int]]:
        """(node, processes) of a generation of `world` processes (see the module docstring).
        Raises ElasticError when the nodes cannot hold them."""
        out, left = [], world
        for node in self.nodes:
            if left <= 0:
                break
            n = min(left, self.per_node)
            out.append((node, n))
            left -= n
        if left > 0:
            raise ElasticError(f"{world} processes do not fit {len(self.nodes)} host(s) of {self.per_node} each")
        return out

    def hosts_of_ranks(self, world: int) -> dict[int, str]:
        """Rank -> node name for a generation of `world` processes."""
        ranks, r = {}, 0
        for node, n in self.place(world):
            for _ in range(n):
                ranks[r] = node.name
                r += 1
        return ranks
