"""Agent processes: the command loop, and `tenplex agent` listening for runtimes.

`serve(sock, host, ...)` runs one `Agent` on one connection (a socket pair from `Runtime.local`)
until `stop` or EOF. `serve_forever(listener, agent, token)` is the long-lived form behind
`tenplex agent`: it accepts one runtime at a time over the control channel (`channel`: a bounded
HMAC handshake, then typed frames, never pickles), keeps the store between connections (a job's
state outlives the runtime that moved it), and when a connection drops in the middle of an
execution it aborts that execution (the staging tag is deleted; the src tag was never written).
SIGTERM/SIGINT or a `stop` command end it.

A request is `{"cmd": name, "args": {...}}`; the reply `{"ok": result}` or `{"err": text}`, the
text naming the command and, where known, the message and op that failed. While a command runs,
the connection's beat thread (`beat`) sends `{"beat": n}` every `BEAT_S` seconds, so a runtime
tells a busy agent from a stopped or hung one, and takes the runtime's one-way `{"cancel": why}`:
the running command's transport waits give up within a poll, naming `why`
(`transport.errors`); a cancel that comes after its command finished is dropped, with no reply.

Output: `tenplex agent` prints one line `tenplex agent NAME: control ...` on stdout once it
listens (launchers wait for it); diagnostics go to the logger `tenplex.agent` (stderr with
`tenplex: ` through the CLI's logging, `-q`/`-v`).

Credentials: the control token (`--token-file` or `$TENPLEX_AGENT_TOKEN`) authenticates
runtimes; the REST API, when served (`--rest`), has its own token (`--rest-token-file` or
`$TENPLEX_REST_TOKEN`), which must differ from the control token: a REST client can read and
write tensors, but never command the agent.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import traceback
from typing import Any

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent.agent import Agent
from tenplex.runtime.agent.beat import REPLY_IDLE_S, Heartbeat, is_cancel
from tenplex.runtime.agent.channel import Channel, ChannelError, accept, listen, parse_address
from tenplex.runtime.agent.wire import WireError

COMMANDS = ("name", "address", "connect", "load", "load_files", "rename_tag", "reserve", "premap", "keep_slice", "prepare", "run",
            "commit", "abort", "fetch", "delete_tag", "exists", "memory", "rest_url", "tag_meta")  # fmt: skip
TOKEN_ENV = "TENPLEX_AGENT_TOKEN"
REST_TOKEN_ENV = "TENPLEX_REST_TOKEN"
log = logging.getLogger("tenplex.agent")


def serve(sock: socket.socket, host: str, timeout: float = 30.0, local: str | None = None, transport: str = "ucx") -> None:
    """The process target of `Runtime.local`: one agent, one connection (`local`, `transport`: see `Agent`)."""
    agent = Agent(host, timeout, local=local, transport=transport)
    with contextlib.suppress(Exception):  # the transport now, while the runtime still works; a failure shows in `address`
        agent._peer()
    freeze_start()
    channel = Channel(sock, "runtime")
    try:
        handle(agent, channel)
    finally:
        channel.close()
        agent.stop()
    for stream in (sys.stdout, sys.stderr):  # then exit at once: tearing down the interpreter
        with contextlib.suppress(Exception):  # (numpy, ucxx, ...) only delays the runtime's close
            stream.flush()
    os._exit(0)


def freeze_start() -> None:
    """Every object of the agent's start (modules, numpy, UCX) out of the cyclic collector's reach
    (`gc.freeze`): Python's full collection walked them all, 56-68 ms in both agents at once inside
    the second repeated execute of the agents bench (its `adopt`: 62-74 ms of 579-834); after the
    freeze no full collection ran in 6-8 repeats. No collection first: it would cost each agent's
    start as much (~70 ms), for the little cyclic garbage of imports that stays frozen instead."""
    gc.freeze()


def handle(agent: Agent, channel: Channel) -> bool:
    """Run commands from `channel` until EOF (returns False) or `stop` (returns True)."""
    with Heartbeat(channel, agent) as beat:
        while True:
            try:
                request = beat.pending.pop(0) if beat.pending else channel.recv(None)
            except ChannelError:
                return False
            if is_cancel(request):  # late: its command finished (and replied) before it came
                continue
            name, kwargs = _request(request)
            if name == "stop":
                with contextlib.suppress(ChannelError):
                    channel.send({"ok": None}, REPLY_IDLE_S)
                return True
            with beat.busy():
                reply = _run(agent, name, kwargs)
            try:
                _reply(channel, name, reply)
            except ChannelError:
                return False


def _request(request: Any) -> tuple[str, dict]:
    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str) or not isinstance(request.get("args"), dict):
        return "", {}
    if not all(isinstance(k, str) for k in request["args"]):
        return "", {}
    return request["cmd"], request["args"]


def _run(agent: Agent, name: str, kwargs: dict) -> dict:
    try:
        if name not in COMMANDS:
            raise ExecutionError(f"unknown agent command {name!r}")
        return {"ok": getattr(agent, name)(**kwargs)}
    except Exception as e:  # noqa: BLE001 (every failure goes back to the runtime as text)
        detail = str(e) if isinstance(e, ExecutionError) else f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        return {"err": f"{name or 'request'} failed: {detail}"}


def _reply(channel: Channel, name: str, reply: dict) -> None:
    try:
        channel.send(reply, REPLY_IDLE_S)
    except ChannelError:
        raise
    except WireError as e:  # the result cannot travel (nothing was sent): say so instead
        channel.send({"err": f"{name} failed: its result cannot be sent: {e}"}, REPLY_IDLE_S)


# ---- `tenplex agent` ---------------------------------------------------------------------
def serve_forever(listener: socket.socket, agent: Agent, token: str | None) -> None:
    """Accept runtimes one at a time until `stop` (see the module docstring). The accept wakes
    twice a second: a SIGTERM that the kernel delivers to another thread (UCX starts its own)
    does not interrupt a blocking accept in this one, but Python runs its handler here then."""
    while True:
        try:
            channel = accept(listener, agent.host, token)
        except ChannelError as e:
            log.warning("agent %s: rejected a connection: %s", agent.host, e)
            continue
        if channel is None:
            continue
        try:
            stopped = handle(agent, channel)
        finally:
            channel.close()
            agent.forget_slices()  # slice ids belong to the connection that sent them
        if agent.execution is not None:
            ex = agent.execution
            agent.abort(ex.job, ex.dst_tag)
            log.warning("agent %s: runtime left during %s/%s; aborted it", agent.host, ex.job, ex.dst_tag)
        if stopped:
            return


def rest_address(rest: str, token: str | None, rest_token: str | None) -> tuple[str, int]:
    """(host, port) of `--rest [HOST]:PORT`, checked before anything starts. Raises ExecutionError."""
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise ExecutionError(f"--rest {rest!r}: expected [HOST]:PORT with a port in 0..65535")
    from tenplex.runtime.rest.server import is_loopback

    if not is_loopback(host) and not rest_token:
        raise ExecutionError(f"--rest {rest!r}: serving the store beyond loopback needs a REST token "
                             f"(--rest-token-file or ${REST_TOKEN_ENV})")  # fmt: skip
    if rest_token and rest_token == token:
        raise ExecutionError("the REST token must differ from the control token (a REST client must not command the agent)")
    return host, int(port)


def run_agent(name: str, control: str, token: str | None, ucx_ip: str | None, ucx_port: int,
              rest: str | None, timeout: float, rest_token: str | None = None, memory_budget: int | None = None,
              spill_dir: str | None = None, local: str | None = None, mount_dir: str | None = None) -> None:  # fmt: skip
    """`tenplex agent`: serve until SIGTERM/SIGINT or `stop`; prints one line once listening.
    Raises ExecutionError for a bad address or a REST setting that is not safe."""
    rest_at = rest_address(rest, token, rest_token) if rest else None
    parse_address(control)
    listener = listen(control, token)
    agent = Agent(name, timeout, ucx_ip, ucx_port, memory_budget, spill_dir, local)

    def _term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    try:
        with contextlib.ExitStack() as views:
            if mount_dir is not None:  # the store as files (job/<job>/<tag>/...), for the agent's lifetime
                from tenplex.runtime.fuse.store import mount

                os.makedirs(mount_dir, exist_ok=True)
                views.enter_context(mount(agent.store, mount_dir, read_only=True))
            _serve_agent(name, control, listener, agent, token, rest_at, rest_token, local, mount_dir)
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        if listener.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                os.unlink(control)
        agent.stop()


def _serve_agent(name: str, control: str, listener: socket.socket, agent: Agent, token: str | None, rest_at: Any,
                 rest_token: str | None, local: str | None, mount_dir: str | None) -> None:  # fmt: skip
    """Print the one line launchers wait for, then serve runtimes until the end."""
    line = f"tenplex agent {name}: control {control}"
    if rest_at is not None:
        line += f", REST {agent.serve_rest(*rest_at, rest_token)}"
    if local is not None:
        line += f", local {local}"
    if mount_dir is not None:
        line += f", files {mount_dir}"
    freeze_start()
    print(line, flush=True)  # stdout, for launchers that wait for it
    log.debug("agent %s: serving until SIGTERM or a runtime's stop", name)
    serve_forever(listener, agent, token)
