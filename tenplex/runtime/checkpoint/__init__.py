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

Names resolve lazily (`tenplex._lazy`): an agent that only maps and writes `.npy` files
(`runtime.agent.files`) imports `checkpoint.npy` without the directory writers and the compiler.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "PTC_FILE": "directory", "VALUES_FILE": "directory", "CheckpointError": "directory", "read_checkpoint": "directory",
    "write_checkpoint": "directory", "write_checkpoint_dir": "directory", "FORMAT": "manifest", "MANIFEST": "manifest",
    "VERSION": "manifest", "SerdeError": "manifest", "load": "read", "swap_in": "swap", "save": "write",
})  # fmt: skip
