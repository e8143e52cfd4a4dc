"""The copies of a plan on one node without agents: the physical limit of a repeated execute.

`CopyLimit(plan, src, dst, hosts)` builds, from each host's slice (`compiler.emit.slices`, decoded
as agents do, `agent.sliced`), every region copy the agents make: a host's local copies and its
network parts copied straight into the receiving host's dst regions (as `agent.direct` does), on
arrays made once here (every dst array shared by the hosts, as the receivers' arenas are).
`seconds()` times them with one thread per host, all at once (numpy copies without the GIL; glibc
copies as in the agents where this process started with their tunables, `runtime.agent.tunables`):
what agents on this machine would take with no control messages, no bookkeeping and no wait. Its
ratio to a warm memcpy of the same bytes shows how far the copy pattern itself (strided regions,
many small copies, hosts sharing the memory bus) stays from one flat memcpy. It holds its own
copy of the arrays (every host's src arrays and the dst arrays once: about twice the state) for
as long as it lives. `of_kind(strided)` splits the copies into those of one run of bytes on both sides and
the rest, so the bench can show each kind's speed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np


class CopyLimit:
    def __init__(self, plan: Any, src: Any, dst: Any, hosts: list[str]):
        from tenplex.compiler.emit.slices import host_slices
        from tenplex.runtime.agent.rounds import Execution
        from tenplex.runtime.agent.sliced import Sliced
        from tenplex.runtime.arrays import np_dtype

        sliced = {h: Sliced(h, s) for h, s in host_slices(plan, src, dst, hosts).items()}
        shared: dict[tuple[str, int], np.ndarray] = {}
        arrays = {h: [shared.setdefault((sid, d), np.ones(shape, np_dtype(dt))) if side == "dst" else np.ones(shape, np_dtype(dt))
                      for side, sid, d, dt, shape in s.meta] for h, s in sliced.items()}  # fmt: skip

        runs = {h: Execution(h, "bench", "src", "dst", s) for h, s in sliced.items()}  # for `Execution.view`
        for h, ex in runs.items():
            ex.arrays = arrays[h]

        def view(h: str, r: int) -> np.ndarray:
            return runs[h].view(r)

        into = {p.tag: (h, p) for h, s in sliced.items() for parts in s.network.values() for p in parts if not p.outgoing}
        self.work: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for h, s in sliced.items():
            pairs = [(view(h, row[3]), view(h, row[4])) for batches in s.batches.values() for b in batches for row in b]
            for parts in s.network.values():
                for p in (p for p in parts if p.outgoing):
                    peer, theirs = into[p.tag]
                    pairs += [(view(h, i), view(peer, j)) for i, j in zip(p.regions, theirs.regions)]
            self.work[h] = pairs
        self.nbytes = sum(d.nbytes for pairs in self.work.values() for _, d in pairs)

    def of_kind(self, strided: bool) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """Each host's copies whose two regions are both one run of bytes (`strided=False`), or
        the others: a region with runs shorter than the array (a column block), where each run
        is a small copy with ordinary stores, against a flat memcpy's one long one."""
        return {h: [(s, d) for s, d in pairs if (s.flags.c_contiguous and d.flags.c_contiguous) != strided]
                for h, pairs in self.work.items()}  # fmt: skip

    def seconds(self, work: dict[str, list[tuple[np.ndarray, np.ndarray]]] | None = None) -> float:
        """Wall seconds of every host's copies (or of `work`, e.g. `of_kind(True)`), one thread per
        host, all at once."""
        threads = [threading.Thread(target=_copy, args=(pairs,)) for pairs in (work or self.work).values()]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0


def _copy(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for src, dst in pairs:
        np.copyto(dst, src)
