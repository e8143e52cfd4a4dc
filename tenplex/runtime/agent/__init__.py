"""One agent per host: it owns the host's `TensorStore` and UCX worker and runs its share of a plan.

- agent.py: `Agent`, the commands a runtime sends (load, prepare, run, commit, abort, ...);
- rounds.py: one host's slice of a plan, run round by round; parts.py: how a network part's
  bytes are staged (packing, unpacking, a scratch pool);
- server.py: the agent process (`tenplex agent`, or a child of `Runtime.local`) and its control
  connection; beat.py: the connection's heartbeat thread, which also takes the runtime's cancel;
  client.py: the runtime's end (`AgentHandle`, the all-hosts barrier); slicing.py:
  the runtime's slices of its plans and which of them each agent keeps;
- fleet.py: real agent processes on this machine, optionally one per emulated host; tunables.py:
  the glibc copy tunables that new agent interpreters get (non-temporal stores from 1 MiB).
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "Agent": "agent", "AgentFleet": "fleet", "AgentHandle": "client", "TOKEN_ENV": "server", "connect": "server",
    "run_agent": "server", "serve": "server",
})  # fmt: skip
