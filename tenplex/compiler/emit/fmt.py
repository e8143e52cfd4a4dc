"""Plain-text formatting shared by the emitters and `tenplex.compiler.emit.describe`: sizes, durations, tables.

Everything here returns plain strings (no terminal markup), so output can go to files and
golden tests; tables are left-aligned text with right-aligned numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int | float) -> str:
    """`512 B`, `12.0 MiB`: binary units, one decimal above 1 KiB."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def human_seconds(s: float) -> str:
    """`0 s`, `512 ns`, `12.3 us`, `4.56 ms`, `1.23 s`: three significant digits."""
    if s == 0:
        return "0 s"
    for scale, unit in ((1e-6, "ns"), (1e-3, "us"), (1.0, "ms")):
        if s < scale:
            return f"{s / scale * 1e3:.3g} {unit}"
    return f"{s:.3g} s"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 op`, `2 ops`, `3 copies` (with `nouns`)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def ratio(value: float, bound: float) -> str:
    """`value / bound` as `1.000x`; `n/a` when the bound is 0 (and the value is not)."""
    if bound == 0:
        return "1.000x" if value == 0 else "n/a (bound is 0)"
    return f"{value / bound:.3f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "", indent: str = "  ") -> str:
    """A plain-text table. `align` has one letter per column, `l` or `r`; columns it leaves out
    are right-aligned when every cell is a number."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [
        align[i] == "r" if i < len(align) else bool(rows) and all(isinstance(r[i], int | float) for r in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        out = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)]
        return (indent + "  ".join(out)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule] + [line(r) for r in cells])
