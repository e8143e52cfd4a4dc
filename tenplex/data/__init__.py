"""Dataset state under elastic data parallelism (docs/design.md §7).

- `index`: per-sample (file, offset, length) over a file table, with a fingerprint;
  `formats.build_index` builds one from numpy, Megatron `.bin/.idx` or TFRecord files;
- `order`: the epoch permutation (order stream v1) and the global batch of every step;
- `state`: the O(1) global cursor, advanced only at optimizer commit;
- `partition` and `schedule`: each rank's share of a step, for any W at any step boundary;
- `reader`: sample bytes and decoded values; `torch_data` (imports torch): datasets and samplers;
- `prefetch/`: a rank's next steps fetched in reading order into a bounded cache, peers first;
- `rank_files`: a rank's upcoming samples as a tree of files (names, sizes, headers), which
  `tenplex.runtime.fuse.dataset` mounts as a read-only directory, switched atomically at a rescale;
  `step_file` and `ranges_file`: that directory's files of a step, and of where the view's samples lie.

The names below load their module on first use, so `tenplex.cli.dataset` (registered by the
`tenplex` command) costs no numpy work at start-up. Of the other components, the package imports only `tenplex.ir`.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "DataError": "errors", "DatasetIndex": "index", "FileEntry": "index", "build_index": "formats",
    "ORDER_VERSION": "order", "TAIL_POLICIES": "order", "Order": "order", "epoch_order": "order",
    "Layout": "partition", "RankStep": "partition", "RankView": "partition", "rank_view": "partition",
    "split_bounds": "partition", "split_counts": "partition", "Schedule": "schedule", "replay": "schedule",
    "STATE_VERSION": "state", "DataState": "state", "SampleReader": "reader",
    "PrefetchConfig": "prefetch.prefetcher", "PrefetchStats": "prefetch.plan", "Prefetcher": "prefetch.prefetcher", "RankFiles": "rank_files",
})  # fmt: skip
