"""`without_gc`: Python's cyclic garbage collector paused around work that allocates many objects
and no reference cycles (compiling a plan, reading a PTC, a reshard).

Compiling a large reconfiguration allocates millions of small frozen objects and no reference
cycles; the collector's repeated scans of them cost ~30% of compile time at 175B scale, and up
to 2x of reading a large PTC. Reference counting still frees everything; the collector's
previous state is restored. What the block allocated goes to the oldest generation unscanned
(`gc.freeze`, then `gc.unfreeze`: two list splices): re-enabled, the collector would otherwise
scan all of it at the next allocation (5-14 ms before `tenplex reshard` prints its result).
Nothing here imports numpy (the CLI pauses the collector before it imports numpy).

Invariants: only the outermost block re-enables the collector; a process that froze objects
itself (`gc.get_freeze_count() > 0`, agents after their start) keeps them frozen.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if enabled:
                if not gc.get_freeze_count():  # unfreeze would thaw what the process froze itself
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()

    return wrapper
