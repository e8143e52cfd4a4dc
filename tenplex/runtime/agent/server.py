"""Agent processes: the command loop, and `tenplex agent` listening for runtimes.

`serve(conn, host, ...)` runs one `Agent` on one connection (a multiprocessing Pipe from
`Runtime.local`) until `stop` or EOF. `serve_forever(listener, agent)` is the long-lived form
behind `tenplex agent`: it accepts one runtime connection at a time, keeps the store between
connections (a job's state outlives the runtime that moved it), and when a connection drops in
the middle of an execution it aborts that execution (the staging tag is deleted; the src tag
was never written). SIGTERM/SIGINT or a `stop` command end it.

Control addresses: a filesystem path is a Unix socket (file mode 0600; reachable from other
network namespaces on the same machine), `HOST:PORT` is TCP and needs a token (the
multiprocessing HMAC handshake), read from `--token-file` or `$TENPLEX_AGENT_TOKEN`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent.agent import Agent

COMMANDS = ("name", "address", "connect", "load", "prepare", "values", "run_round", "commit", "abort", "fetch",
            "delete_tag", "exists", "memory", "rest_url")  # fmt: skip
TOKEN_ENV = "TENPLEX_AGENT_TOKEN"


def serve(conn: Any, host: str, timeout: float = 30.0) -> None:
    """The process target of `Runtime.local`: one agent, one connection."""
    agent = Agent(host, timeout)
    try:
        handle(agent, conn)
    finally:
        agent.stop()


def handle(agent: Agent, conn: Any) -> bool:
    """Run commands from `conn` until EOF (returns False) or `stop` (returns True)."""
    while True:
        try:
            name, kwargs = conn.recv()
        except (EOFError, OSError):
            return False
        if name == "stop":
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("ok", None))
            return True
        try:
            if name not in COMMANDS:
                raise ExecutionError(f"unknown agent command {name!r}")
            reply: tuple[str, Any] = ("ok", getattr(agent, name)(**kwargs))
        except Exception as e:
            detail = str(e) if isinstance(e, ExecutionError) else f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            reply = ("err", f"{name} failed: {detail}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return False


# ---- `tenplex agent` ---------------------------------------------------------------------
def parse_address(address: str) -> tuple[Any, str]:
    """(address, family) for multiprocessing.connection: a path -> AF_UNIX, HOST:PORT -> AF_INET."""
    if "/" in address or ":" not in address:
        return address, "AF_UNIX"
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ExecutionError(f"control address {address!r}: expected a socket path or HOST:PORT")
    return (host.strip("[]"), int(port)), "AF_INET"


def authkey(family: str, token: str | None) -> bytes | None:
    if family == "AF_INET" and not token:
        raise ExecutionError(f"a TCP control address needs a token (--token-file or ${TOKEN_ENV})")
    return token.encode() if token else None


def listen(address: str, token: str | None) -> Listener:
    addr, family = parse_address(address)
    if family == "AF_UNIX" and os.path.exists(addr):
        raise ExecutionError(f"control socket {addr} already exists (another agent?); remove it first")
    old = os.umask(0o177) if family == "AF_UNIX" else None
    try:
        return Listener(addr, family, authkey=authkey(family, token))
    finally:
        if old is not None:
            os.umask(old)


def connect(address: str, token: str | None, timeout: float = 30.0) -> Connection:
    """A runtime's connection to a `tenplex agent` (retried until `timeout` while it starts)."""
    import time

    addr, family = parse_address(address)
    key = authkey(family, token)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Client(addr, family, authkey=key)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            if time.monotonic() > deadline:
                raise ExecutionError(f"no agent answers at {address}: {e}") from None
            time.sleep(0.05)
        except (AuthenticationError, ConnectionResetError, EOFError) as e:
            raise ExecutionError(f"the agent at {address} rejected the connection (wrong token?): {e}") from None


def serve_forever(listener: Listener, agent: Agent) -> None:
    """Accept runtimes one at a time until `stop` (see the module docstring)."""
    while True:
        _wait_for_client(listener)
        try:
            conn = listener.accept()
        except (OSError, EOFError, AuthenticationError) as e:  # a client that failed the handshake
            print(f"tenplex agent {agent.host}: rejected a connection: {e}", file=sys.stderr, flush=True)
            continue
        with conn:
            stopped = handle(agent, conn)
        if agent.execution is not None:
            ex = agent.execution
            agent.abort(ex.job, ex.dst_tag)
            print(f"tenplex agent {agent.host}: runtime left during {ex.job}/{ex.dst_tag}; aborted it",
                  file=sys.stderr, flush=True)  # fmt: skip
        if stopped:
            return


def _wait_for_client(listener: Listener, poll: float = 0.5) -> None:
    """Return once a client is waiting. The wait wakes every `poll` s: a SIGTERM that the kernel
    delivers to another thread (UCX starts its own) does not interrupt a blocking accept in this
    one, but Python runs its handler here at the next wake-up."""
    sock = listener._listener._socket  # multiprocessing's listening socket
    while not select.select([sock], [], [], poll)[0]:
        pass


def run_agent(name: str, control: str, token: str | None, ucx_ip: str | None, ucx_port: int,
              rest: str | None, timeout: float) -> None:  # fmt: skip
    """`tenplex agent`: serve until SIGTERM/SIGINT or `stop`; prints one line once listening."""
    agent = Agent(name, timeout, ucx_ip, ucx_port)
    listener = listen(control, token)

    def _term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    try:
        line = f"tenplex agent {name}: control {control}"
        if rest:
            host, _, port = rest.rpartition(":")
            line += f", REST {agent.serve_rest(host or '127.0.0.1', int(port or 0), token)}"
        print(line, flush=True)
        serve_forever(listener, agent)
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()  # also removes a Unix socket file
        agent.stop()
