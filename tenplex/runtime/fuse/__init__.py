"""FUSE views: a host's tensor store, or one rank's upcoming dataset samples, as a directory that
training programs read with plain file I/O.

- `mount`: the glue both views share (mfusepy's FUSE on libfuse3 with one-copy reads, a mount
  thread, the kernel's read-ahead, mount checks);
- `session`: read-only views served in the kernel's protocol without libfuse (`kernel`: the
  byte layouts; `nodes`: node ids and listings; `backing`: FUSE passthrough to backing files),
  which is how a root process gets passthrough from Linux >= 6.9 (libfuse 3.14 cannot ask);
- `npy`: the `.npy` bytes of a stored array, generated on the fly, and parsed back on writes;
- `store`: a `TensorStore` (or a subtree) as `.npy`/`.json` files, writable on request;
- `dataset`: a rank's samples of its next steps, switched atomically at a rescale.
"""

from tenplex.runtime.fuse.mount import READ_AHEAD_KB, FuseUnavailable, fuse_unavailable_reason, is_mounted, unmount
from tenplex.runtime.fuse.npy import load_npy, parse_npy

__all__ = ["READ_AHEAD_KB", "FuseUnavailable", "fuse_unavailable_reason", "is_mounted", "load_npy", "parse_npy", "unmount"]
