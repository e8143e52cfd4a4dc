"""The `range` query parameter of the REST API: which box of a tensor a request selects.

Syntax: comma-separated pieces, one per leading dimension, optionally in `[...]`; a piece is
`a:b`, `a:`, `:b`, `:` (half-open, non-negative) or an index `i`, which means `i:i+1` and keeps
the dimension (length 1). Missing trailing dimensions are taken whole (as in the reference). No
steps, no negative indices, no clamping: a piece outside the shape is an error (416).
"""

from __future__ import annotations

import re

from tenplex.ir.box import Box

__all__ = ["RangeError", "parse_range"]

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
        raise RangeError(f"range: {text!r} has {len(pieces)} pieces but the tensor has shape {shape}", 416)
    start, stop = [0] * len(shape), list(shape)
    for d, piece in enumerate(pieces):
        a, b = _piece(piece, text)
        b = shape[d] if b is None else b
        if not a <= b <= shape[d]:
            raise RangeError(f"range: piece {piece.strip()!r} of {text!r} is outside dim {d} of size {shape[d]}", 416)
        start[d], stop[d] = a, b
    return Box(start, stop)


def _piece(piece: str, text: str) -> tuple[int, int | None]:
    m = _PIECE.fullmatch(piece)
    if m is None:
        why = "steps are not supported" if piece.count(":") > 1 else "expected a:b, a:, :b, : or an index"
        why = "negative indices are not supported" if "-" in piece else why
        raise RangeError(f"range: bad piece {piece.strip()!r} in {text!r}: {why}", 400)
    if m["index"] is not None:
        return int(m["index"]), int(m["index"]) + 1
    a = int(m["start"]) if m["start"] else 0
    b = int(m["stop"]) if m["stop"] else None
    if b is not None and a > b:
        raise RangeError(f"range: piece {piece.strip()!r} in {text!r} is reversed ({a} > {b})", 400)
    return a, b
