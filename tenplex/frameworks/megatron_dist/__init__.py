"""Megatron-LM `torch_dist` checkpoints (megatron-core `dist_checkpointing`, Megatron's default
`--ckpt-format`): a PyTorch DCP directory with Megatron's global keys, `common.pt` and
`metadata.json`, in a Megatron-LM tree or bare.

`locate` / `missing` (files.py) find the step directory and say what a half-written one lacks;
`read_megatron_dist` (read.py) reads it with its layout; `dst_ptc` (layout.py) is megatron-core's
cut of it for another tp x pp x dp; `reshard_megatron_dist` (reshard.py) writes that cut as
`torch_dist`; `inspect_megatron_dist` (describe.py) describes it. Errors are the legacy reader's
`CheckpointFormatError`s, naming the file.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "locate": "files", "missing": "files", "read_megatron_dist": "read", "dst_ptc": "layout",
    "reshard_megatron_dist": "reshard", "inspect_megatron_dist": "describe",
})  # fmt: skip
