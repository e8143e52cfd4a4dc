"""What every `tenplex` command shares: one-line errors, byte sizes, PTC arguments, output files.

Errors: a `TenplexError`, an unwritable output or a usage error prints one line
`tenplex: error: <message>` on stderr and exits with code 2 (`fail`). Outputs are computed in
full before the file is written, and written atomically (`write_output`), so an error leaves no
file behind.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from tenplex.compiler.emit import human_bytes
from tenplex.ir.errors import ParseError
from tenplex.ir.files import read_json, write_atomic
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import FORMAT as PTC_FORMAT
from tenplex.ir.serialize import ptc_from_json

__all__ = ["EXIT_ERROR", "SIZE", "fail", "frontend", "load_state", "write_output"]

EXIT_ERROR = 2


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def fail(message: str, code: int = EXIT_ERROR) -> None:
    click.echo(f"tenplex: error: {_one_line(message)}", err=True)
    sys.exit(code)


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
    "format" key is parsed as a PTC, any other as a spec. Anything else is a compact spec.
    Raises ParseError or SpecError naming the argument.
    """
    path = Path(arg)
    if _exists(path.is_dir) and (path / "rank_map.json").is_file():  # the reference's structure JSON
        from tenplex.frameworks.structure.read import read_structure

        return read_structure(path)[0]
    if not (arg.endswith(".json") or _exists(path.is_file)):
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
    click.echo(f"tenplex: wrote {output} ({human_bytes(len(text.encode()))})", err=True)
