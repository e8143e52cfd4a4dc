"""Files every format shares, none of them trusted: names that stay inside their directory,
regular files only, bounded strict JSON; and writes that leave a file or directory complete or
absent (temporary beside the target, fsync, rename), with errors that say which path and why.

Reading (each function raises the caller's error type, with a one-line message naming the path):
- `check_relative(name, what, error)`: a relative `/`-separated path without empty, `.` or `..`
  components, backslashes or NUL bytes (one spelling: `x/./y` and `x//y` are refused, not aliased);
- `confined(root, rel, what, error)`: `root / rel`, refused when it resolves outside `root`;
- `open_regular(path, what, error)`: opens a regular file, never blocking: a fifo, a device, a
  socket or a directory is refused by what it is;
- `read_text` / `read_json`: a bounded UTF-8 (JSON) regular file; NaN and Infinity refused.
Writing:
- `write_atomic(path, data)`, `atomic_dir(out)`: complete or absent (`atomic_dir` never overwrites);
- `write_failure(path, err, error)`: the error for an OSError while writing, naming the path and
  the errno (`No space left on device (ENOSPC)`); `os_error_of(e)` finds it behind torch's
  writers; `one_line(e)`: a library's reason on one line.

Invariants:
- no function here opens a non-regular file or returns a path outside its root;
- `write_atomic` and `atomic_dir` never leave a partial target: on any failure the temporary is
  removed and the target is as it was.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tenplex.ir.errors import ParseError, TenplexError

MAX_JSON_BYTES = 4 << 30  # a plan for 10,000 GPUs is well below this; a manifest far below


def reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def check_relative(name: Any, what: str, error: type[TenplexError]) -> str:
    """`name` if it is a safe relative path (see the module docstring); raises `error` naming it."""
    if not isinstance(name, str):
        raise error(f"{what} {name!r} is not a string")
    parts = name.split("/")
    bad = "\0" in name or "\\" in name or any(p in ("", ".", "..") for p in parts)
    if bad:
        raise error(f"{what} {name!r} cannot be a relative file path (empty, '.' or '..' components, "
                    "a leading '/', a backslash or a NUL byte)")  # fmt: skip
    return name


def confined(root: Path, rel: Any, what: str, error: type[TenplexError], seen: dict[str, str] | None = None) -> Path:
    """`root / rel`, refused unless `rel` is a safe relative path that resolves inside `root`.
    `seen`: a dict the caller keeps across calls with one `root`, where the real paths of the
    directories resolved so far are remembered (a symlink is followed as `os.path.realpath` does)."""
    path = root / check_relative(rel, what, error)
    seen = {} if seen is None else seen
    real_root = _real_dir(root, "", seen)
    up, _, name = rel.rpartition("/")
    real = _resolved(os.path.join(_real_dir(root, up, seen), name))
    if not _inside(real, real_root):
        raise error(f"{path}: {what} {rel!r} leads outside {root} (to {real})")
    return path


def _inside(real: str, real_root: str) -> bool:
    """Whether `real` is `real_root` or under it; both real paths (`os.path.realpath`, or a real
    directory joined with a checked name: no `.`, `..` or empty components), so a prefix of
    whole components says what `os.path.commonpath` would (~10x faster)."""
    return real == real_root or real.startswith(real_root if real_root.endswith(os.sep) else real_root + os.sep)


def _real_dir(root: Path, rel: str, seen: dict[str, str]) -> str:
    """The real path of directory `root / rel` (`rel` checked), from `seen` or resolved into it."""
    if rel not in seen:
        up, _, name = rel.rpartition("/")
        seen[rel] = _resolved(os.path.join(_real_dir(root, up, seen), name)) if rel else os.path.realpath(root)
    return seen[rel]


def _resolved(path: str) -> str:
    """`path` (whose directory is real) with its last component resolved if it is a symlink."""
    return os.path.realpath(path) if os.path.islink(path) else path


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str | os.PathLike) -> tuple[int, os.stat_result]:
    """(fd, its stat) of `path` opened for reading without blocking (a fifo opens at once). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def regular_fd(path: str | os.PathLike, what: str, error: type[TenplexError]) -> tuple[int, int]:
    """(fd, size) of `path` opened for reading (`O_NONBLOCK`, which a regular file's reads and
    maps ignore): for readers that `pread` or `mmap` it. Raises `error` as `open_regular` does."""
    try:
        fd, st = _open(path)
    except FileNotFoundError:
        raise error(f"{path}: missing ({what})") from None
    except OSError as e:
        raise error(f"{path}: cannot open ({what}): {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{path}: is {file_kind(st.st_mode)}, not a regular file ({what})")
    return fd, st.st_size


def open_regular(path: Path, what: str, error: type[TenplexError]) -> BinaryIO:
    """`path` opened for binary reading; raises `error` when it is missing, unreadable or not a
    regular file (a fifo is opened non-blocking, so it is refused rather than waited on)."""
    fd, _ = regular_fd(path, what, error)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_regular(path: Path, what: str, error: type[TenplexError]) -> None:
    """Raises `error` unless `path` is (or links to) a regular file: for readers that need a name."""
    open_regular(path, what, error).close()


def read_text(path: str | os.PathLike, error: type[TenplexError] = ParseError, what: str | None = None,
              limit: int = MAX_JSON_BYTES) -> str:  # fmt: skip
    """The UTF-8 text of the regular file `path`, at most `limit` bytes. Raises `error` naming the
    file (and `what` it holds) when it is missing, not a regular file, larger than `limit` or not UTF-8."""
    the = f" the {what}" if what else ""
    try:
        fd, st = _open(path)
    except OSError as e:
        raise error(f"{path}: cannot read{the}: {e.strerror or e}") from None
    mode = st.st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: is {file_kind(mode)}, not a regular file{f' ({what})' if what else ''}")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{path}: cannot read{the}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{path}: the {what or 'file'} is larger than {_human(limit)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: the {what or 'file'} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _human(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} bytes"


def loads(text: str | bytes) -> Any:
    """Strict JSON: ValueError for NaN, Infinity and -Infinity as for any other error."""
    return json.loads(text, parse_constant=reject_constant)


def read_json(path: str | os.PathLike, error: type[TenplexError] = ParseError, what: str | None = None,
              limit: int = MAX_JSON_BYTES) -> Any:  # fmt: skip
    """The strict JSON document in the regular file `path` (see `read_text`). Raises `error`
    naming the file, also for invalid or too deeply nested JSON."""
    text = read_text(path, error, what, limit)
    the = f" ({what})" if what else ""
    try:
        return loads(text)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise error(f"{path}: not valid JSON{the}: {one_line(e)}") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON{the}: nested too deeply") from None


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
    turns it into an exception (the `tenplex` command does), also one raised as the temporary is
    made: the cleanup removes this process's temporaries of `out` by name.

    Raises: `error` naming `out` when it exists before or after the block (never overwritten).
    """
    out = Path(out)
    if out.exists():
        raise error(f"{out}: already exists (refusing to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    prefix = f".{out.name}.tmp-{os.getpid()}-"
    try:  # made in the try: a SIGTERM raised just after the mkdir (still in mkdtemp) must remove it too
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would outlive the rename
        yield tmp
        if out.exists():
            raise error(f"{out}: appeared while writing (refusing to overwrite)")
        os.rename(tmp, out)
    except BaseException:
        for mine in out.parent.glob(f"{glob.escape(prefix)}*"):  # this process's temporaries of `out`
            shutil.rmtree(mine, ignore_errors=True)
        raise


def write_failure(path: str | os.PathLike, err: OSError, error: type[TenplexError]) -> TenplexError:
    """The error for `err`, raised while writing `path`: names the path, the reason and the errno."""
    code = err.errno
    reason = os.strerror(code) if code else str(err)
    name = f" ({errno.errorcode[code]})" if code in errno.errorcode else ""
    return error(f"{path}: cannot write: {reason}{name}")


def os_error_of(e: BaseException | None) -> OSError | None:
    """The OSError `e` is, or was raised from or while handling (torch's zip writer turns a failed
    write into a RuntimeError whose context is the OSError); None when there is none."""
    for _ in range(16):
        if e is None or isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
    return None


def one_line(e: BaseException, limit: int = 300) -> str:
    """`e`'s message with all whitespace runs as single spaces, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
