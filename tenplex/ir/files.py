"""Files every format shares: strict JSON reads, and writes that leave a file or directory
complete or absent (temporary beside the target, fsync, rename).

Invariants:
- `read_json` reads only regular files of bounded size, UTF-8, rejects NaN and Infinity, and
  names the file in every error;
- `write_atomic` and `atomic_dir` never leave a partial target: on any failure the temporary is
  removed and the target is as it was (absent for `atomic_dir`, which never overwrites).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenplex.ir.errors import ParseError, TenplexError

MAX_JSON_BYTES = 4 << 30  # a plan for 10,000 GPUs is well below this


def reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def read_regular(path: str | os.PathLike, error: type[TenplexError], limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file `path` (symlinks followed), at most `limit` of them. Raises
    `error` naming the file when it is missing, not a regular file (a FIFO or device would block
    or never end), larger than `limit`, or unreadable."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file")
    if st.st_size > limit:
        raise error(f"{path}: {st.st_size} bytes, more than the {limit} a file of this kind may have")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{path}: more than the {limit} bytes a file of this kind may have")
    return data


def read_json(path: str | os.PathLike, error: type[TenplexError] = ParseError) -> Any:
    """The decoded JSON document in file `path` (UTF-8; NaN and Infinity rejected). Raises
    `error` naming the file when it cannot be read (see `read_regular`) or is not JSON."""
    data = read_regular(path, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start} is {data[e.start:e.start + 1]!r})") from None
    try:
        return json.loads(text, parse_constant=reject_constant)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise error(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON: nested too deeply") from None


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` (text or bytes) to `path` via a temporary file, fsync and rename: complete or absent."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Delete the temporaries of `atomic_dir(out)` whose writer process is gone (a SIGKILL cannot
    be caught; the next writer cleans up after it). Returns what it removed."""
    removed = []
    for tmp in out.parent.glob(f".{glob.escape(out.name)}.tmp-*-*"):
        pid = tmp.name[len(out.name) + 6 :].split("-", 1)[0]
        if pid.isdecimal() and int(pid) != os.getpid() and not _alive(int(pid)) and tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, error: type[TenplexError] = TenplexError) -> Iterator[Path]:
    """Yield a new temporary directory beside `out` (mode 0755); rename it to `out` when the
    block succeeds, delete it when the block fails: `out` is complete or absent.

    The temporary is named `.<out>.tmp-<pid>-<random>`; temporaries of writers that died (SIGKILL)
    are removed first (`remove_stale_temporaries`). A SIGTERM reaches the cleanup when the process
    turns it into an exception (the `tenplex` command does).

    Raises: `error` naming `out` when it exists before or after the block (never overwritten).
    """
    out = Path(out)
    if out.exists():
        raise error(f"{out}: already exists (refusing to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would outlive the rename
        yield tmp
        if out.exists():
            raise error(f"{out}: appeared while writing (refusing to overwrite)")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
