"""Names and ids of the IR: tensor names, sub-tensor ids and paths, partition ids, value names,
host names.

Invariants: a name is a string without NUL bytes. A NUL cannot be part of a file path, a C
string or a UCX tag: it would cut the name short wherever it is passed on, or make `open` fail
far from the document that carried it.
"""

from __future__ import annotations

from tenplex.ir.errors import IRError


def check_name(what: str, value: object) -> None:
    """Raise IRError naming `what` (e.g. "sub-tensor 'w/tp0' path") unless `value` is a name."""
    if not isinstance(value, str):
        raise IRError(f"{what} {value!r} is not a string")
    if "\x00" in value:
        raise IRError(f"{what} {value!r} contains a NUL byte")
