"""One data-parallel rank's upcoming samples as a read-only directory: `view` mounts it and switches
it at a rescale (`mount`, `FuseView`, `read_view`); `ops` is its file system operations (`ViewFS`)."""

from tenplex.runtime.fuse.dataset.ops import ViewFS
from tenplex.runtime.fuse.dataset.view import FuseView, fuse_unavailable_reason, is_mounted, mount, read_view

__all__ = ["FuseView", "ViewFS", "fuse_unavailable_reason", "is_mounted", "mount", "read_view"]
