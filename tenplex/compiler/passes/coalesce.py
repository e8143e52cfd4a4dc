"""`coalesce`: group copies into messages of at most `max_message_bytes`.

(A copy within one device is never cut: runtimes execute it as an in-place view or one memcpy
with no message buffer, so a local message holding one may exceed the limit.)

Three kinds of message, each packed in op order: network copies per (src host, dst host);
local copies per host (src state read on the same host); forwards per landing message (they
can only run after it). Fills and values travel in no message.
"""

from __future__ import annotations

import attrs
import numpy as np

from tenplex.compiler import keysort
from tenplex.compiler.program import Program
from tenplex.compiler.table import I64, MessageTable
from tenplex.ir.errors import CompileError


@attrs.frozen
class Coalesce:
    name = "coalesce"
    requires = frozenset({"sources"})
    provides = frozenset({"messages"})

    def apply(self, program: Program) -> Program:
        t = program.table
        hosts = program.topology.hosts
        host_ix = {h: i for i, h in enumerate(hosts)}
        devices = program.topology.devices
        host_of = np.zeros(max((d.id for d in devices), default=-1) + 1, I64)
        host_of[[d.id for d in devices]] = [host_ix[d.host] for d in devices]
        itemsize = np.array([program.dst.itemsizes[name] for name in t.tensors], I64)
        nbytes = t.volume * itemsize[t.tensor]
        if float(t.volume.astype(np.float64) @ itemsize[t.tensor].astype(np.float64)) >= 2.0**62:
            raise CompileError("the plan would move 2^62 bytes or more, past the compiler's int64 columns")
        src, dst = host_of[t.src_dev], host_of[t.dst_dev]
        limit = program.options.max_message_bytes
        read = np.flatnonzero(~t.forward)  # copies reading the src state: per (src host, dst host)
        direct = _pack(read, src[read] * len(hosts) + dst[read], nbytes, limit)
        message_of = np.full(t.n, -1, I64)
        message_of[t.copy_at[direct[0]]] = np.repeat(np.arange(len(direct[1])), direct[1])
        fwd = np.flatnonzero(t.forward)  # forwards: per landing message, in that message's dst host
        landing = np.full(t.n, -1, I64)
        landing[program.edges[:, 1]] = program.edges[:, 0]
        after = message_of[landing[t.copy_at[fwd]]]
        forwards = _pack(fwd, after, nbytes, limit)
        ops = np.concatenate((direct[0], forwards[0]))
        lens = np.concatenate((direct[1], forwards[1]))
        firsts = ops[np.cumsum(lens) - lens]
        m = len(lens)
        table = MessageTable(hosts, np.arange(m, dtype=I64), src[firsts], dst[firsts], np.add.reduceat(nbytes[ops], np.cumsum(lens) - lens) if m else np.zeros(0, I64),
                             np.zeros(m, I64), np.concatenate(([0], np.cumsum(lens))), t.copy_at[ops])  # fmt: skip
        return attrs.evolve(program, messages=table)


def _pack(rows: np.ndarray, group: np.ndarray, nbytes: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Copies `rows` (copy rows in op order) packed in op order into messages of at most `limit`
    bytes per group (groups in order of first appearance; a copy larger than the limit goes
    alone): (the rows in message order, the copies per message)."""
    if not len(rows):
        return rows, np.zeros(0, I64)
    by = keysort.argsort(group)  # by group, in op order within each
    heads = keysort.starts(group[by])
    lens = np.diff(np.append(heads, len(by)))
    runs = keysort.argsort(by[heads])  # groups by their first copy: one sort of the groups, not of the copies
    order = rows[by[keysort.ranges(heads[runs], lens[runs])]]
    sizes = nbytes[order]
    cum = np.concatenate(([0], np.cumsum(sizes)))
    n = len(order)
    counts = lens[runs]  # copies per group, in group order
    group_end = np.repeat(np.cumsum(counts), counts)
    stop = np.searchsorted(cum, cum[:-1] + limit, side="right") - 1  # a message from i ends before stop
    stop = np.minimum(np.maximum(stop, np.arange(1, n + 1)), group_end)
    # `stop` never falls, so where a message from i - 1 would end at i, every message before
    # ends by i: i starts one whatever came before. Only runs between such copies are walked.
    sure = np.flatnonzero(np.concatenate(([True], stop[:-1] == np.arange(1, n))))
    then = np.append(sure[1:], n)
    inner = []
    for a, b in zip(sure[then - sure > 1].tolist(), then[then - sure > 1].tolist()):
        i = int(stop[a])
        while i < b:
            inner.append(i)
            i = int(stop[i])
    starts = np.sort(np.concatenate((sure, np.array(inner, I64))))
    return order, np.diff(np.append(starts, n))
