"""`AgentFleet`: real `tenplex agent` processes on this machine, optionally one per emulated host.

    with AgentFleet(["h0", "h1"]) as fleet, Runtime.connect(fleet.controls) as rt: ...
    with EmulatedHosts(4, rate="1gbit") as hosts, AgentFleet(names, hosts=hosts) as fleet: ...

Each agent is `python -m tenplex.cli agent --name NAME --control DIR/NAME.sock`, started in its
own process (inside emulated host i's network namespace with `hosts`, plus `--ucx-ip` of that
host, so agents reach each other over UCX TCP through the shaped links). Control sockets are Unix
sockets in a private temporary directory: the runtime reaches them from any namespace. The fleet
waits for each agent's "listening" line; leaving the block sends SIGTERM, then kills what is left,
and removes the directory. `kill(name)` ends one agent abruptly (failure tests). With `local`,
each agent also serves its store to this machine's processes on `stores[name]`.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import tunables


class AgentFleet:
    def __init__(self, names: Sequence[str], *, hosts: Any = None, timeout: float = 30.0, rest: bool = False,
                 start_timeout: float = 60.0, local: bool = False) -> None:  # fmt: skip
        if hosts is not None and len(hosts.hosts) < len(names):
            raise ValueError(f"{len(names)} agents need as many emulated hosts, got {len(hosts.hosts)}")
        self.names, self.hosts, self.timeout, self.rest, self.local = list(names), hosts, timeout, rest, local
        self.start_timeout = start_timeout
        self.dir = ""
        self.controls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.rest_urls: dict[str, str] = {}
        self.stores: dict[str, str] = {}  # with `local`: each agent's local socket (`runtime.shm`)

    def __enter__(self) -> AgentFleet:
        self.dir = tempfile.mkdtemp(prefix="tenplex-agents-")
        try:
            for i, name in enumerate(self.names):
                self._start(i, name)
            for name in self.names:
                self._wait_listening(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _argv(self, i: int, name: str) -> list[str]:
        argv = [sys.executable, "-m", "tenplex.cli", "agent", "--name", name, "--control", self.controls[name],
                "--timeout", str(self.timeout)]  # fmt: skip
        if self.hosts is not None:
            argv += ["--ucx-ip", self.hosts.hosts[i].address]
        if self.rest:
            argv += ["--rest", "127.0.0.1:0"]
        if self.local:
            self.stores[name] = os.path.join(self.dir, f"{name}.store")
            argv += ["--local", self.stores[name]]
        return argv

    def _start(self, i: int, name: str) -> None:
        self.controls[name] = os.path.join(self.dir, f"{name}.sock")
        kwargs = {"stdout": subprocess.PIPE, "stderr": open(self._log(name), "w"), "text": True,  # noqa: SIM115
                  "env": tunables.environ({**os.environ, "PYTHONUNBUFFERED": "1"})}  # fmt: skip
        argv = self._argv(i, name)
        self.procs[name] = self.hosts.run(i, argv, **kwargs) if self.hosts is not None else subprocess.Popen(argv, **kwargs)
        kwargs["stderr"].close()

    def _log(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.log")

    def log(self, name: str) -> str:
        """The agent's stderr so far."""
        with contextlib.suppress(OSError), open(self._log(name)) as f:
            return f.read()
        return ""

    def _wait_listening(self, name: str) -> None:
        proc, deadline = self.procs[name], time.monotonic() + self.start_timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, min(left, 0.5)))
            if ready:
                line = proc.stdout.readline()
                if line.startswith(f"tenplex agent {name}:"):
                    if ", REST " in line:
                        self.rest_urls[name] = line.rsplit(", REST ", 1)[1].split(",")[0].strip()
                    return
            if proc.poll() is not None or left <= 0:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "did not start in time"
                raise ExecutionError(f"agent {name!r} {why}: {self.log(name)[-2000:]}")

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
