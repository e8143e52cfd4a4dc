"""Megatron-LM legacy checkpoint trees (`iter_*/mp_rank_TT[_PPP]/model_optim_rng.pt`) as PTCs.

Entry points: `read_megatron` (read.py) -> `MegatronCheckpoint` (meta.py), `write_megatron`
(write.py), `reshard_megatron` / `inspect_megatron` (reshard.py). Below them: the on-disk tree
(tree.py), torch tensors (tensors.py), `args` <-> model and layout (args.py), parameter keys
(names.py), Adam state (optim.py), the distributed optimizer's buffers (distrib.py), RNG (rng.py).
Errors are `CheckpointFormatError`s naming the file and the key.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "CheckpointFormatError": "tree", "MegatronCheckpoint": "meta", "MegatronMeta": "meta", "read_megatron": "read",
    "write_megatron": "write", "reshard_megatron": "reshard", "inspect_megatron": "reshard", "parse_layout": "args",
})  # fmt: skip
