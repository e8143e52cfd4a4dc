"""Start a `tenplex ... mount` command in a subprocess, for the FUSE tests of the store and dataset views."""

import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_mount(*argv: str) -> tuple[subprocess.Popen, str]:
    """`python -m tenplex.cli ARGV` in a subprocess; returns once it printed its 'mounted' line
    (the process and that line), or fails the test with what it printed, within 30 s."""
    cmd = [sys.executable, "-m", "tenplex.cli", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if "mounted" not in line:
        proc.kill()
        pytest.fail(f"no 'mounted' line: {line!r} {proc.communicate()[1]!r}")
    return proc, line
