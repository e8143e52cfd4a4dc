"""The code blocks of the README and docs/, and how to run them as a newcomer would.

A doc's blocks run in order, in a fresh copy of the repository's tracked files (what a clone
has), with the project's virtualenv first on PATH and the copy first on PYTHONPATH:

- ```sh / ```bash: one `bash -euo pipefail` script; it fails the doc when it exits non-zero;
- ```console: `$ command` lines run like sh blocks; the lines after a command are its expected
  output: each must appear, in order, in what the command prints (stdout then stderr); a line
  `...` stands for any lines, and `...` inside a line for any text;
- ```python: one `python` process;
- other blocks (json, text, yaml) are shown, not run.

An HTML comment right before a block changes that: `<!-- doc-test: skip REASON -->` shows it
without running it (the reason is required and reported); `<!-- doc-test: timeout SECONDS -->`
gives a slow block more time (default 120 s). Processes a block leaves in the background are
ended when the doc is done.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
RUN = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console", "python": "python"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*doc-test:\s*(\w+)\s*(.*?)\s*-->\s*$")


@attrs.frozen
class Block:
    doc: str
    line: int
    kind: str  # sh | console | python | shown
    code: str
    skip: str = ""  # the reason, when not run
    timeout: float = 120.0

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of markdown file `path`, with their directives."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip, timeout = "", 120.0
        d = _DIRECTIVE.search(before)
        if d and d[1] == "skip":
            skip = d[2] or "(no reason given)"
        elif d and d[1] == "timeout":
            timeout = float(d[2])
        out.append(Block(str(path.relative_to(ROOT)), line, RUN.get(m[1], "shown"), m[2], skip, timeout))
    return out


def fresh_copy(dest: Path) -> Path:
    """The repository's tracked files copied to `dest` (a clone's view), with the virtualenv linked."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src, dst = ROOT / rel.decode(), dest / rel.decode()
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


class Session:
    """Runs one doc's blocks in one working copy; `close` ends what they left running."""

    def __init__(self, where: Path):
        self.cwd = where
        venv = ROOT / ".venv" / "bin"
        self.env = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "PYTHONPATH": str(where),
                    "HYPOTHESIS_PROFILE": "ci", "COLUMNS": "100", "TERM": "dumb"}  # fmt: skip
        self.env.pop("VIRTUAL_ENV", None)
        self.groups: list[int] = []

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        self.groups.append(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return subprocess.CompletedProcess(argv, -9, out, err + f"\n(timed out after {timeout:.0f} s)")
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def close(self) -> None:
        for pgid in self.groups:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break


def run_block(session: Session, block: Block) -> str | None:
    """None when `block` ran as its doc says, else what went wrong."""
    if block.kind == "sh":
        done = session.run(["bash", "-euo", "pipefail", "-c", block.code], block.timeout)
        return None if done.returncode == 0 else _failure(block.code, done)
    if block.kind == "python":
        done = session.run([sys.executable, "-c", block.code], block.timeout)
        return None if done.returncode == 0 else _failure(block.code, done)
    for command, expected in console_steps(block.code):
        done = session.run(["bash", "-o", "pipefail", "-c", command], block.timeout)
        problem = match_output(expected, done.stdout + done.stderr)
        if problem:
            return f"$ {command}\n{problem}\n--- it printed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
    return None


def console_steps(code: str) -> list[tuple[str, list[str]]]:
    """[(command, expected lines)] of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def match_output(expected: list[str], actual: str) -> str | None:
    """None when every expected line appears in `actual` in order ('...' lines skip any lines)."""
    lines = [" ".join(x.split()) for x in actual.splitlines()]
    at, gap = 0, True
    for want in (" ".join(x.split()) for x in expected):
        if want == "...":
            gap = True
            continue
        rx = re.compile(".*".join(re.escape(part.strip()) for part in want.split("...")) + r"\Z")
        for i in range(at, len(lines) if gap else min(at + 1, len(lines))):
            if rx.match(lines[i]):
                at, gap = i + 1, False
                break
        else:
            return f"expected line not printed (in this order): {want!r}"
    return None


def _failure(code: str, done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- block:\n{code}\n--- output:\n{(done.stdout + done.stderr)[-3000:]}"
