"""`tenplex job run` under SIGTERM and SIGINT (issue 12, item 6): torchrun and its workers run in
a session of their own, so the controller must end that process group and reap it, then exit
128 + the signal with one line. Real processes: marked slow and multiprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mounts import ROOT

PROGRAM = """
import os, pathlib, sys, time
job_dir = pathlib.Path(sys.argv[sys.argv.index("--job-dir") + 1])
(job_dir / "pids").mkdir(exist_ok=True)
(job_dir / "pids" / os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended (its parent reaps it)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_torchrun_and_its_workers(tmp_path, sig):
    (tmp_path / "sleep.py").write_text(PROGRAM)
    (tmp_path / "job.json").write_text(json.dumps({"program": "sleep.py", "devices": 2, "timeout": 300}))
    job_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tenplex.cli", "job", "run", str(tmp_path / "job.json"),
                             "--job-dir", str(job_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
            files = list((job_dir / "pids").glob("*")) if (job_dir / "pids").exists() else []
            workers = [int(p.read_text()) for p in files if p.read_text()]
        children = {pid: _cmdline(pid) for pid in _children(proc.pid)}
        torchrun = [pid for pid, cmd in children.items() if "torch.distributed.run" in cmd]
        agent = [pid for pid, cmd in children.items() if "tenplex.cli agent" in cmd]  # the job's store
        assert len(torchrun) == 1 and len(agent) == 1 and all(_alive(p) for p in [*torchrun, *workers, *agent])
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        for pid in workers:  # never leave a sleeper behind, whatever failed
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    name = signal.Signals(sig).name
    assert err == f"tenplex: error: generation 0: interrupted by {name}; torchrun and its workers were ended\n"
    assert not [p for p in [*torchrun, *workers, *agent] if _alive(p)]
    status = json.loads((job_dir / "status.json").read_text())
    assert status["state"] == "failed" and name in status["error"]
