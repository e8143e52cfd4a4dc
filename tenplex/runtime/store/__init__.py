"""One host's in-memory tensor store: a tree of paths whose leaves are arrays or typed values.

tree.py: `TensorStore` (put, read a box without copying, rename, delete); leaf.py: paths, leaves
and values; memory.py: resident bytes, LRU order and spill files; layout.py: where an agent keeps
a job's state (`/job/<job>/<tag>/<partition>/<path>`).
"""

from tenplex.runtime.store.leaf import LeafMeta, StoreError, parse_path
from tenplex.runtime.store.tree import TensorStore

__all__ = ["LeafMeta", "StoreError", "TensorStore", "parse_path"]
