"""Training state on disk as trees of `.npy` files.

- `save(state, path)` / `load(path)` (`write`, `read`; format in `manifest`): a nested state dict
  of torch tensors, numpy arrays and scalars, in place of `torch.save`/`torch.load`;
- `read_checkpoint` / `write_checkpoint_dir` (`directory`): a PTC and its sub-tensors, the
  directory `tenplex reshard` reads and writes;
- `swap_in` (`swap`): replace a directory by a complete new one atomically;
- `npy`: `.npy` files of untrusted checkpoints (headers checked against the file size before
  loading; the framework readers use it too; a bfloat16 or float8 header names its dtype, and
  the raw bits older versions wrote are still read); paths, regular files, bounded JSON and
  write errors are `tenplex.ir.files`.
"""

from tenplex.runtime.checkpoint.directory import (
    PTC_FILE,
    VALUES_FILE,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
    write_checkpoint_dir,
)
from tenplex.runtime.checkpoint.manifest import FORMAT, MANIFEST, VERSION, SerdeError
from tenplex.runtime.checkpoint.read import load
from tenplex.runtime.checkpoint.swap import swap_in
from tenplex.runtime.checkpoint.write import save

__all__ = [
    "FORMAT", "MANIFEST", "PTC_FILE", "VALUES_FILE", "VERSION", "CheckpointError", "SerdeError", "load",
    "read_checkpoint", "save", "swap_in", "write_checkpoint", "write_checkpoint_dir",
]  # fmt: skip
