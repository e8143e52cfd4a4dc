"""Start one generation of a training program under torchrun, and end it.

`launch(spec, job_dir, generation, config, stop_step)` runs

    python -m torch.distributed.run --standalone --nproc-per-node W PROGRAM ARGS --job-dir DIR

in a new session (so the whole process tree can be signalled), with TENPLEX_JOB_DIR,
TENPLEX_GENERATION, TENPLEX_TP/DP/PP, TENPLEX_STOP_STEP and TENPLEX_FAIL_RANKS set, output to
`DIR/logs/gen-N.log`. `terminate(proc)` ends that tree: SIGTERM, then SIGKILL after a grace
period; it always reaps the process. `failure_cause(log)` finds in a failed generation's log the
line that says why: the exception of the rank torchrun names as the root cause (torchrun prefixes
a worker's traceback with `[rankN]:`), its signal if it was killed, else the program's last
message before torchrun's own report.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.cluster import Cluster, Node
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import JobSpec
from tenplex.elastic.signals import JobInterrupted

MASTER_PORT = 29600  # + generation: torchrun's rendezvous on node 0 when a job spans hosts
MAX_CAUSE = 500  # characters of the cause quoted in the one-line error
LOG_TAIL_BYTES = 1 << 20  # of a failed generation's log, read for the cause


def terminate_surely(proc: subprocess.Popen | Nodes | None) -> None:
    """`terminate(proc)` (nothing for None), also when the first SIGTERM, SIGINT or SIGHUP arrives
    meanwhile: `signals.raise_on_signals` raises it once, so the next try completes."""
    for _ in range(3):
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(JobInterrupted, subprocess.TimeoutExpired):
            terminate(proc)


def log_path(job_dir: str | os.PathLike, generation: int) -> Path:
    return Path(job_dir) / "logs" / f"gen-{generation}.log"


def command(spec: JobSpec, job_dir: Path, config: ParallelConfig) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(config.world),
            str(spec.program), *spec.args, "--job-dir", str(job_dir)]  # fmt: skip


def launch(spec: JobSpec, job_dir: Path, generation: int, config: ParallelConfig, stop_step: int | None,
           fail: tuple[int, ...] = (), extra_env: dict[str, str] | None = None, cluster: Cluster | None = None,
           node_env: Callable[[Node], dict[str, str]] | None = None) -> subprocess.Popen | Nodes:  # fmt: skip
    """Start generation `generation` (see the module docstring); `fail`: ranks that crash at
    `stop_step`; `extra_env`: more variables; `cluster` with several nodes: one torchrun node
    per host (`cluster.place`), each with its host's directory and `node_env(node)`.

    Raises: ElasticError naming the job file when `fail` names a rank the generation does not
    have or leaves no survivor (nothing is started)."""
    if any(r >= config.world for r in fail):
        raise ElasticError(f"{spec.source}: the failure at step {stop_step} names ranks {list(fail)}, "
                           f"but generation {generation} has {config.world} (0..{config.world - 1})")  # fmt: skip
    if fail and len(fail) >= config.world:
        raise ElasticError(f"{spec.source}: the failure at step {stop_step} leaves no survivor")
    env = dict(os.environ, TENPLEX_JOB_DIR=str(job_dir), TENPLEX_GENERATION=str(generation),
               TENPLEX_TP=str(config.tp), TENPLEX_DP=str(config.dp), TENPLEX_PP=str(config.pp),
               TENPLEX_STOP_STEP="" if stop_step is None else str(stop_step), TENPLEX_FAIL_RANKS=",".join(map(str, fail)),
               OMP_NUM_THREADS="1", **(extra_env or {}))  # fmt: skip
    log = log_path(job_dir, generation)
    log.parent.mkdir(parents=True, exist_ok=True)
    if cluster is None or not cluster.multi:
        with log.open("wb") as out:
            return subprocess.Popen(command(spec, job_dir, config), stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
    placed = cluster.place(config.world)
    procs = []
    for i, (node, n) in enumerate(placed):
        node.dir.mkdir(parents=True, exist_ok=True)
        node_vars = {"TENPLEX_JOB_DIR": str(node.dir), **(node_env(node) if node_env else {})}
        if node.iface:
            node_vars["GLOO_SOCKET_IFNAME"] = node.iface
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(placed)), "--node-rank", str(i),
                "--nproc-per-node", str(n), "--master-addr", placed[0][0].address, "--master-port", str(MASTER_PORT + generation % 1000),
                str(spec.program), *spec.args, "--job-dir", str(node.dir)]  # fmt: skip
        with (log if i == 0 else log.with_name(f"gen-{generation}-{node.name}.log")).open("wb") as out:
            procs.append(node.run(argv, stdout=out, stderr=subprocess.STDOUT, env={**env, **node_vars}, start_new_session=True))
    return Nodes(procs)


class Nodes:
    """The torchrun nodes of one generation, as one process: `poll` is None while all run and none
    failed, else the first failure seen (the others' exits follow from it, or from `terminate`),
    or 0 once all succeeded; `returncode` is None until every node exited (so `terminate` ends
    the others when one failed)."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs
        self.pid = procs[0].pid
        self.failure: int | None = None

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        if self.failure is None:
            self.failure = next((c for c in codes if c not in (None, 0)), None)
        return self.failure if self.failure is not None else (None if None in codes else 0)

    @property
    def returncode(self) -> int | None:
        return None if any(p.poll() is None for p in self.procs) else self.poll()


def terminate(proc: subprocess.Popen | Nodes, grace: float = 10.0) -> None:
    """End the process tree of `proc` (TERM, then KILL after `grace` s) and reap it."""
    if isinstance(proc, Nodes):
        for p in proc.procs:
            terminate(p, grace)
        return
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(5.0)


def failure_message(job_dir: str | os.PathLike, generation: int, returncode: int) -> str:
    """One line: the generation, its exit code, the cause in its log (`failure_cause`), the log."""
    path = log_path(job_dir, generation)
    try:
        with path.open("rb") as f:  # the end says why: a long run's log may be large
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            cause = failure_cause(f.read().decode(errors="replace"))
    except OSError:
        cause = ""
    cause = f": {cause[:MAX_CAUSE]}" if cause else ""
    return f"generation {generation}: the program exited with code {returncode}{cause}; log {path}"


def failure_cause(log: str) -> str:
    """The one line that says why a generation failed (module docstring); "" when the log has none.
    In order: the root-cause rank's exception, an exception or `error:` line of the program
    without a rank prefix, the root cause's signal, another rank's exception, the last line."""
    own: list[str] = []
    by_rank: dict[int, list[str]] = {}
    for line in log.splitlines():
        if m := _RANK_LINE.match(line):
            by_rank.setdefault(int(m[1]), []).append(m[2].removeprefix(" "))
        elif not _LAUNCHER_LINE.match(line):
            own.append(line)
    if "Root Cause (first observed failure):" in own:  # torchrun's report: where the program's output ends
        own = own[: _report_start(own)]
        rank, signal_name = _root_cause(log)
    else:
        rank, signal_name = None, None
    if cause := _exception(by_rank.get(rank, [])):
        return f"rank {rank}: {cause}"
    if cause := _exception(own):  # a message the program printed itself (no rank prefix)
        return cause
    if signal_name:
        return f"rank {rank}: killed by {signal_name}"
    for r in sorted(by_rank):  # another rank's exception: often only a consequence
        if cause := _exception(by_rank[r]):
            return f"rank {r}: {cause}"
    return next((line.strip() for line in reversed(own) if line.strip()), "")


_RANK_LINE = re.compile(r"\[rank(\d+)\]:(.*)")
_LAUNCHER_LINE = re.compile(r"\[?[WEIDF]\d{4} \d\d:\d\d:\d\d")  # torch's glog-style log lines (and c10d's)


def _report_start(lines: list[str]) -> int:
    """Index of the first line of torchrun's own traceback and report."""
    end = lines.index("Root Cause (first observed failure):")
    starts = [i for i, line in enumerate(lines[:end]) if line.startswith("Traceback (most recent call last):")]
    return starts[-1] if starts else end


def _root_cause(log: str) -> tuple[int | None, str | None]:
    """(rank, signal name or None) of torchrun's "Root Cause" entry."""
    block = log.rsplit("Root Cause (first observed failure):", 1)[1]
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", block, re.MULTILINE)
    signal_name = re.search(r"^\s*exitcode\s*:\s*-\d+.*\((SIG[A-Z]+)\)", block, re.MULTILINE)
    return (int(rank[1]) if rank else None), (signal_name[1] if signal_name else None)


def _exception(lines: list[str]) -> str:
    """The exception line of the last Python traceback in `lines` (frames are indented, the
    exception is not), else the last line of the form `<program>: error: <message>`."""
    found = ""
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            rest = (x for x in lines[i + 1 :] if x.strip() and not x.startswith(" "))
            found = next(rest, found).strip()
        elif ": error: " in line and not line.startswith(" "):
            found = line.strip()
    return found
