"""Dataset state under elastic data parallelism (DESIGN.md section 7).

- `index`: per-sample (file, offset, length) over a file table, with a fingerprint;
  `formats.build_index` builds one from numpy, Megatron `.bin/.idx` or TFRecord files;
- `order`: the epoch permutation (order stream v1) and the global batch of every step;
- `state`: the O(1) global cursor, advanced only at optimizer commit;
- `partition` and `schedule`: each rank's share of a step, for any W at any step boundary;
- `reader`: sample bytes and decoded values; `torch_data` (imports torch): datasets and samplers;
- `prefetch`: a rank's next steps fetched in reading order into a bounded cache, peers first;
- `rank_files` and `fuse.dataset` (imports mfusepy when mounting): a rank's upcoming samples as a
  read-only FUSE directory, switched atomically at a rescale.

The names below load their module on first use, so `tenplex.cli.dataset` (registered by the
`tenplex` command) costs no numpy work at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DataError": "errors", "DatasetIndex": "index", "FileEntry": "index", "build_index": "formats",
    "ORDER_VERSION": "order", "TAIL_POLICIES": "order", "Order": "order", "epoch_order": "order",
    "Layout": "partition", "RankStep": "partition", "RankView": "partition", "rank_view": "partition",
    "split_bounds": "partition", "split_counts": "partition", "Schedule": "schedule", "replay": "schedule",
    "STATE_VERSION": "state", "DataState": "state", "SampleReader": "reader",
    "PrefetchConfig": "prefetch.prefetcher", "PrefetchStats": "prefetch.plan", "Prefetcher": "prefetch.prefetcher", "RankFiles": "rank_files",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tenplex.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tenplex.data.{_EXPORTS[name]}"), name)
