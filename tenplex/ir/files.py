"""Files every format shares: strict JSON reads, and writes that leave a file or directory
complete or absent (temporary beside the target, fsync, rename).

Invariants:
- `read_json` rejects NaN and Infinity and names the file in every error;
- `write_atomic` and `atomic_dir` never leave a partial target: on any failure the temporary is
  removed and the target is as it was (absent for `atomic_dir`, which never overwrites).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenplex.ir.errors import ParseError, TenplexError


def reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: str | os.PathLike, error: type[TenplexError] = ParseError) -> Any:
    """The decoded JSON document in file `path` (NaN and Infinity rejected). Raises `error`
    naming the file when it cannot be read or is not JSON."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    try:
        return json.loads(text, parse_constant=reject_constant)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise error(f"{path}: not valid JSON: {e}") from None


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


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, error: type[TenplexError] = TenplexError) -> Iterator[Path]:
    """Yield a new temporary directory beside `out` (mode 0755); rename it to `out` when the
    block succeeds, delete it when the block fails: `out` is complete or absent.

    Raises: `error` naming `out` when it exists before or after the block (never overwritten).
    """
    out = Path(out)
    if out.exists():
        raise error(f"{out}: already exists (refusing to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would outlive the rename
        yield tmp
        if out.exists():
            raise error(f"{out}: appeared while writing (refusing to overwrite)")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
