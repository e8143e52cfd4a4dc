"""The `range` query parameter of the REST API: which box of a tensor a request selects.

Syntax: comma-separated pieces, one per leading dimension, optionally in `[...]`; a piece is
`a:b`, `a:`, `:b`, `:` (half-open, non-negative) or an index `i`, which means `i:i+1` and keeps
the dimension (length 1). Missing trailing dimensions are taken whole (as in the reference). No
steps, no negative indices, no clamping: a piece outside the shape is an error (416). Numbers
above `MAX_INDEX` (2**62, beyond any array) are malformed (400), and are refused before Python's
int conversion (which stops at 4300 digits) sees them; messages quote at most 20 characters of
the input.
"""

from __future__ import annotations

import re

from tenplex.ir.box import Box

__all__ = ["MAX_INDEX", "RangeError", "parse_range", "short"]

MAX_INDEX = 1 << 62

_PIECE = re.compile(r"\s*(?:(?P<index>\d+)|(?P<start>\d*)\s*:\s*(?P<stop>\d*))\s*", re.ASCII)


class RangeError(ValueError):
    """A `range` that is malformed (`status` 400) or outside the tensor (`status` 416)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse_range(text: str, shape: tuple[int, ...]) -> Box:
    """The box that `text` (see module doc) selects in an array of `shape`.

    Raises: RangeError (400) for bad syntax, steps, negative or reversed pieces; (416) for more
    pieces than dimensions or a piece outside its dimension.
    """
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    pieces = body.split(",") if body.strip() else []
    if len(pieces) > len(shape):
        raise RangeError(f"range: {short(text)!r} has {len(pieces)} pieces but the tensor has shape {shape}", 416)
    start, stop = [0] * len(shape), list(shape)
    for d, piece in enumerate(pieces):
        a, b = _piece(piece, text)
        b = shape[d] if b is None else b
        if not a <= b <= shape[d]:
            raise RangeError(f"range: piece {short(piece.strip())!r} of {short(text)!r} is outside dim {d} of size {shape[d]}", 416)
        start[d], stop[d] = a, b
    return Box(start, stop)


def short(text: str) -> str:
    """`text`, cut to 20 characters and "..." when longer than 24 (for one-line messages)."""
    return text if len(text) <= 24 else text[:20] + "..."


def _piece(piece: str, text: str) -> tuple[int, int | None]:
    where = f"{short(piece.strip())!r} in {short(text)!r}"
    m = _PIECE.fullmatch(piece)
    if m is None:
        why = "steps are not supported" if piece.count(":") > 1 else "expected a:b, a:, :b, : or an index"
        why = "negative indices are not supported" if "-" in piece else why
        raise RangeError(f"range: bad piece {where}: {why}", 400)
    for number in (m["index"], m["start"], m["stop"]):
        if number and (len(number.lstrip("0")) > 19 or int(number) > MAX_INDEX):
            raise RangeError(f"range: piece {where} has a number above 2**62", 400)
    if m["index"] is not None:
        return int(m["index"]), int(m["index"]) + 1
    a = int(m["start"]) if m["start"] else 0
    b = int(m["stop"]) if m["stop"] else None
    if b is not None and a > b:
        raise RangeError(f"range: piece {where} is reversed ({a} > {b})", 400)
    return a, b
