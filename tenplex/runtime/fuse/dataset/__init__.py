"""One data-parallel rank's upcoming samples as a read-only directory: `view` mounts it and switches
it at a rescale (`mount`, `FuseView`, `read_view`; as root served by `fuse.session`, the sources
passed through); `ops` is its file system operations (`ViewFS`), `names` what each path names,
`layout` what an open file serves (a sample file, a step file: `tenplex.data.step_file`, the
ranges file: `tenplex.data.ranges_file`, or a source file)."""

from tenplex.runtime.fuse.dataset.ops import ViewFS
from tenplex.runtime.fuse.dataset.view import FuseView, fuse_unavailable_reason, is_mounted, mount, read_view

__all__ = ["FuseView", "ViewFS", "fuse_unavailable_reason", "is_mounted", "mount", "read_view"]
