"""Signal handlers set for the length of a block and put back after it.

`handling({signal: handler})` is what `tenplex store mount`, `tenplex dataset mount`, the
elastic controller (`elastic.signals`) and the reshard's preallocation helper
(`runtime.checkpoint.prealloc`) share: Python runs a handler in the main thread, whichever
thread the kernel gave the signal to, so handlers (not the signal mask) are how a process
decides what a signal does within a block.

Invariants: outside the main thread (where Python cannot set handlers) nothing changes; a
signal whose handler was set outside Python (`signal.getsignal` is None) is left alone, as it
could not be put back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["handling"]

Handler = Callable[[int, Any], Any]


@contextlib.contextmanager
def handling(handlers: Mapping[int, Handler]) -> Iterator[None]:
    """Within the block, `handlers[s]` handles signal `s`; the old handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in handlers}
    old = {s: h for s, h in old.items() if h is not None}
    try:
        for s in old:
            signal.signal(s, handlers[s])
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
