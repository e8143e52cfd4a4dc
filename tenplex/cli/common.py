"""What every `tenplex` command shares: exit codes, one-line errors, logging, byte sizes, PTC
arguments, output files and JSON documents.

Exit codes (docs/cli.md; the mapping from exceptions is `tenplex.cli.app`):

    0  EXIT_OK        success
    2  EXIT_USAGE     a usage error or bad input: a `TenplexError`, an unreadable or unwritable file
    3  EXIT_VERIFY    a plan or checkpoint that fails verification (`PlanVerifyError`)
    4  EXIT_INTERNAL  an unexpected exception: a bug in tenplex (the traceback with -v)

1 is never returned by tenplex itself (Python exits 1 when it fails before tenplex runs, e.g. a
missing dependency); 130 is Ctrl-C, 128+N a signal N. Errors print one line
`tenplex: error: <message>` on stderr (`fail`). Outputs are computed in full before the file is
written, and written atomically (`write_output`), so an error leaves no file behind.

Logging: the logger `tenplex` (and its children, e.g. `tenplex.agent`) writes to stderr with the
prefix `tenplex: ` at the level `-q` (WARNING), the default (INFO) or `-v` (DEBUG) set
(`configure_logging`). Progress (the INFO lines of `PROGRESS_LOGGERS`, or of a record logged
with `extra={"progress": True}`: the phases of a long command) shows only where stderr is a
terminal, or with -v. Results go to stdout; diagnostics through logging.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tenplex.ir.errors import ParseError
from tenplex.ir.files import read_json, write_atomic
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import FORMAT as PTC_FORMAT
from tenplex.ir.serialize import ptc_from_json

__all__ = [
    "EXIT_ERROR", "EXIT_INTERNAL", "EXIT_OK", "EXIT_USAGE", "EXIT_VERIFY", "SIZE", "configure_logging", "echo_json",
    "fail", "frontend", "is_verbose", "load_state", "log", "numpy_with_one_blas_thread", "skip_teardown",
    "teardown_skipped", "write_output",
]  # fmt: skip

EXIT_OK = 0
EXIT_USAGE = 2  # usage errors and bad input (what every TenplexError is)
EXIT_VERIFY = 3  # a plan or checkpoint that fails verification
EXIT_INTERNAL = 4  # an unexpected exception: a bug
EXIT_ERROR = EXIT_USAGE  # the name before the codes were told apart

log = logging.getLogger("tenplex")
PROGRESS_LOGGERS = ("tenplex.elastic", "tenplex.progress")  # their INFO lines are progress


_TEARDOWN = {"skip": False}


def skip_teardown() -> None:
    """Let `app.main` end this process without the interpreter's teardown once the command
    returns successfully: for a command that has joined every thread and process it started,
    closed its files and made its outputs durable, with nothing left for exit handlers."""
    _TEARDOWN["skip"] = True


def teardown_skipped() -> bool:
    return _TEARDOWN["skip"]


def numpy_with_one_blas_thread() -> None:
    """Import numpy with one OpenBLAS thread, unless it is imported or the user set the number.

    OpenBLAS starts a server thread per further core when it loads, and each spins for ~0.1 s
    waiting for work that no tenplex command gives it in its own process (no BLAS here), ~60 ms
    CPU of the core that a reshard's writers and helper need (`import numpy`: 0.16-0.18 CPU s,
    0.10-0.12 with one thread). The variable is set only while numpy loads, so processes
    started from here (agents, workers, jobs) get the environment they were given."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"tenplex: error: {_one_line(message)}", err=True)
    sys.exit(code)


class _Stderr(logging.Handler):
    """`tenplex: <message>` on the current stderr (looked up at each record, as click's test
    runner swaps it); progress only on a terminal unless `verbose` (module doc)."""

    verbose = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno < logging.WARNING and not self.verbose and _is_progress(record) and not _tty():
                return
            click.echo(f"tenplex: {_one_line(self.format(record))}", err=True)
        except Exception:  # noqa: BLE001 (logging never raises into the caller)
            self.handleError(record)


def _is_progress(record: logging.LogRecord) -> bool:
    return bool(getattr(record, "progress", False)) or record.name.startswith(PROGRESS_LOGGERS)


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


_verbosity = [0]  # of the command running (or last run): -1 -q, 0, 1 -v


def is_verbose() -> bool:
    """Whether the command runs with -v (tracebacks of internal errors are shown then)."""
    return _verbosity[0] > 0


def configure_logging(verbosity: int) -> Callable[[], None]:
    """The `tenplex` logger at WARNING (-1: -q), INFO (0) or DEBUG (1: -v), to stderr, for one
    command; returns the function that puts the logger back as it was (for in-process callers)."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    _verbosity[0] = verbosity
    handler, old = _Stderr(), log.level
    handler.verbose = verbosity > 0
    log.addHandler(handler)
    log.setLevel(level)

    def restore() -> None:
        log.removeHandler(handler)
        log.setLevel(old)

    return restore


def echo_json(doc: Any) -> None:
    """One JSON document on stdout (`--json`): sorted keys, two-space indent, a final newline."""
    click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))


class _Size(click.ParamType):
    """A byte count: an integer with an optional binary unit (B, K/KiB, M/MiB, G/GiB, T/TiB),
    below 8 EiB (2**63: what a file offset or a buffer length can be)."""

    name = "size"
    _UNITS = {"": 0, "b": 0, "k": 10, "kib": 10, "m": 20, "mib": 20, "g": 30, "gib": 30, "t": 40, "tib": 40}
    LIMIT = 1 << 63

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
        if not m or m[2].lower() not in self._UNITS:
            self.fail(f"{_short(text)!r} is not a size such as 65536, 64KiB, 64MiB or 1GiB", param, ctx)
        # more digits than any size below the limit: refused before int() (which stops at 4300)
        size = int(m[1]) << self._UNITS[m[2].lower()] if len(m[1].lstrip("0")) <= 20 else self.LIMIT
        if size >= self.LIMIT:
            self.fail(f"{_short(text)!r} is too large: sizes go up to 8 EiB", param, ctx)
        return size


def _short(text: str) -> str:
    return text if len(text) <= 24 else text[:20] + "..."


SIZE = _Size()


def frontend() -> Any:
    try:
        from tenplex.frontends import spec
    except ImportError as e:
        raise ParseError(f"model specs need tenplex.frontends, which cannot be imported ({e})") from None
    return spec


def load_state(arg: str) -> PTC:
    """A PTC from a PTC JSON file, a JSON spec file, a compact model spec, or a directory of the
    reference Tenplex's per-rank structure JSON (rank_map.json + rankNN/mp_rank_*.json).

    A file (an existing path, or any name ending in .json) is decoded as JSON: a document with a
    "format" key is parsed as a PTC, any other as a spec. Anything else with an `@` or a `:` is
    a compact spec; what has neither is a missing file. Raises ParseError or SpecError naming
    the argument.
    """
    path = Path(arg)
    if _exists(path.is_dir) and (path / "rank_map.json").is_file():  # the reference's structure JSON
        from tenplex.frameworks.structure.read import read_structure

        return read_structure(path)[0]
    if not (arg.endswith(".json") or _exists(path.is_file)):
        if "@" not in arg and ":" not in arg:  # no spec part at all: a file or directory was meant
            what = "not a file" if _exists(path.exists) else "no such file or directory"
            raise ParseError(f"{arg}: {what} (expected a PTC JSON file, a checkpoint directory or a model spec "
                             "such as gpt-1.3b:tp2,pp2,dp2@4x4)")  # fmt: skip
        return frontend().ptc_from_spec(arg)
    root = read_json(path)
    if isinstance(root, dict) and "format" in root:
        if root["format"] != PTC_FORMAT:
            raise ParseError(
                f"{arg}: format: expected {PTC_FORMAT!r} (a PTC) or a spec without a format, got {root['format']!r}"
            )
        return ptc_from_json(root, arg)
    return frontend().spec_from_json(root, arg).build()


def _exists(test: Any) -> bool:
    """`path.is_file()` or `is_dir()`, False where the name cannot be a path at all (too long:
    a compact spec of thousands of characters is still a spec, and its error says why)."""
    try:
        return bool(test())
    except (OSError, ValueError):
        return False


def write_output(text: str, output: str | None) -> None:
    """Write to stdout, or atomically to `output` (complete or absent)."""
    if output is None or output == "-":
        click.echo(text, nl=False)
        return
    try:
        write_atomic(output, text)
    except OSError as e:
        raise click.ClickException(f"{output}: cannot write: {e.strerror or e}") from None
    from tenplex.compiler.emit import human_bytes  # the compiler imports numpy: not at the command's start

    log.info("wrote %s (%s)", output, human_bytes(len(text.encode())))
