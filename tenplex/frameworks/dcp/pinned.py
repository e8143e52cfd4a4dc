"""Page-locked host memory for copies between device tensors and a tenplex store's arenas.

`pinned(spans)` registers host memory with CUDA (`cudaHostRegister`) for the duration of the
copies of a save or a load, and unregisters it after: the store's pages stay ordinary shared
memory. Without a GPU (or when a span cannot be registered) the copies run unpinned.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator

import numpy as np
import torch

PAGE = mmap.PAGESIZE
REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the store's arenas are mapped read-only


@contextlib.contextmanager
def pinned(spans: list[tuple[int, int]], flags: int = 0) -> Iterator[None]:
    """Host memory spans (address, bytes) page-locked while device tensors are copied to or from
    them, so the copies run as DMA at link speed instead of staging through the driver's bounce
    buffer (on an H100: a 2 GiB save into fresh arena pages 2x faster, a load from the store's
    pages 2-3x; experiments/gpu_store.py). A span that cannot be registered is copied unpinned."""
    cudart = torch.cuda.cudart() if spans and torch.cuda.is_available() else None
    done = []
    try:
        for at, size in spans if cudart else ():
            if int(cudart.cudaHostRegister(at, size, flags)) == 0:
                done.append(at)
        yield
    finally:
        for at in done:
            cudart.cudaHostUnregister(at)


def page_spans(arrays: list[np.ndarray]) -> list[tuple[int, int]]:
    """The arrays' memory as page-aligned (address, bytes) spans, overlapping ones merged."""
    merged: list[list[int]] = []
    for lo, hi in sorted((a.ctypes.data // PAGE * PAGE, -(-(a.ctypes.data + a.nbytes) // PAGE) * PAGE) for a in arrays if a.nbytes):
        if merged and lo < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in merged]
