"""In-process transport: hands the packed buffer over (copying it, as a real link would)."""

from __future__ import annotations

import numpy as np

from tenplex.compiler.plan import Message


class LocalTransport:
    def __init__(self) -> None:
        self.bytes_by_pair: dict[tuple[str, str], int] = {}

    def deliver(self, message: Message, payload: np.ndarray) -> np.ndarray:
        pair = (message.src_host, message.dst_host)
        self.bytes_by_pair[pair] = self.bytes_by_pair.get(pair, 0) + payload.nbytes
        return payload.copy()
