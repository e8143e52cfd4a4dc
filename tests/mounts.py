"""Start a `tenplex ... mount` command in a subprocess, for the FUSE tests of the store and dataset views."""

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_mount(*argv: str, cwd: str | Path = ROOT) -> tuple[subprocess.Popen, str]:
    """`python -m tenplex.cli ARGV` in a subprocess started in `cwd` (the repository, where
    `tenplex` imports from; another directory gets the repository on PYTHONPATH); returns once it
    printed its 'mounted' line (the process and that line), or fails the test with what it
    printed, within 30 s."""
    cmd = [sys.executable, "-m", "tenplex.cli", *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if "mounted" not in line:
        proc.kill()
        pytest.fail(f"no 'mounted' line: {line!r} {proc.communicate()[1]!r}")
    return proc, line
