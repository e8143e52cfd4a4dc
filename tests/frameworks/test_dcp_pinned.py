"""`page_spans`: the page ranges registered for device copies cover every array once."""

import mmap

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tenplex.frameworks.dcp.pinned import PAGE, page_spans, pinned


@given(st.lists(st.tuples(st.integers(0, 5 * PAGE), st.integers(0, 3 * PAGE)), max_size=8))
def test_spans_are_page_aligned_disjoint_and_cover_every_array(cuts):
    buf = np.zeros(10 * PAGE, np.uint8)
    base = -(-buf.ctypes.data // PAGE) * PAGE - buf.ctypes.data  # first page boundary inside buf
    arrays = [buf[base + at : base + at + n] for at, n in cuts]
    spans = page_spans(arrays)
    assert all(at % PAGE == 0 and size % PAGE == 0 and size > 0 for at, size in spans)
    assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # sorted, disjoint
    for a in arrays:
        if a.nbytes:
            lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
            assert any(at <= lo and hi <= at + size for at, size in spans)


def test_without_a_gpu_copies_run_unpinned():
    m = mmap.mmap(-1, PAGE)
    with pinned(page_spans([np.frombuffer(m, np.uint8)])):
        np.frombuffer(m, np.uint8)[:] = 7
    assert m[0] == 7
