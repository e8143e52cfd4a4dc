"""glibc's copy tunables for agent processes: non-temporal stores from 1 MiB (issue 16).

An agent's copies are `np.copyto` of regions (`rounds.local`, `direct.copy`), each a glibc
`memmove` per run of bytes. glibc copies a run of at least `x86_non_temporal_threshold` bytes
with non-temporal stores (written to memory without first reading each destination line), and
shorter ones with ordinary stores, which read every destination line before writing it: a
third more memory traffic, and on the VMs of issue 16 one thread copies 4.9-20 MiB arrays at
7.4-7.9 GB/s against 11.4 with non-temporal stores. glibc sets the threshold to 3/4 of the
last-level cache's per-thread share as the CPU reports it, 114 MiB on these VMs (a 300 MiB L3
shared with the host's other guests), above every array of a sharded model; an agent's copies
go to dst arrays that nobody reads before the commit and that are far larger than any cache,
so agents lower it to `NT_BYTES`. A variable read once by the dynamic loader at a process's
start: `environ` is the environment a new agent interpreter gets (`client.spawn_local`,
`fleet.AgentFleet`); an agent forked from a running process (`Runtime.local(fork=True)`) keeps
that process's setting. A `GLIBC_TUNABLES` that already names the threshold is left as it is.
Only speed changes: what a copy writes is the same with either kind of store.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

VARIABLE = "GLIBC_TUNABLES"
NT_BYTES = 1 << 20  # above the tiny copies (values, rows of a few KiB), below every array of a sharded layer
THRESHOLD = "glibc.cpu.x86_non_temporal_threshold"

_spawning = threading.Lock()  # one agent interpreter started at a time under the changed environment


def environ(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `GLIBC_TUNABLES` setting the non-temporal threshold to `NT_BYTES`, its other
    tunables kept; unchanged when it sets the threshold already."""
    tunables = env.get(VARIABLE, "")
    if THRESHOLD in tunables:
        return dict(env)
    return {**env, VARIABLE: ":".join(t for t in (tunables, f"{THRESHOLD}={NT_BYTES:#x}") if t)}


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """`os.environ` as `environ` makes it while the block starts an interpreter (multiprocessing's
    `spawn` takes this process's environment and has no argument for another), restored after."""
    with _spawning:
        before = os.environ.get(VARIABLE)
        os.environ[VARIABLE] = environ(os.environ)[VARIABLE]
        try:
            yield
        finally:
            if before is None:
                del os.environ[VARIABLE]
            else:
                os.environ[VARIABLE] = before
