"""DeepSpeed ZeRO-1/2 and universal checkpoints as PTCs, and ZeRO-1/2 checkpoints written back
for another DP world size (without DeepSpeed: tenplex never imports it).

Entry points: `read_deepspeed` (read.py), `write_deepspeed` (write.py), `reshard_deepspeed` /
`deepspeed_findings` / `parse_dp` (reshard.py). Below them: the files and DeepSpeed's pickled
classes (files.py), the ZeRO flat partitions (layout.py), the PTC and what rides beside it
(meta.py). Errors are `DeepSpeedError`s naming the file and the key.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "DeepSpeedError": "files", "locate": "files", "read_deepspeed": "read", "write_deepspeed": "write",
    "reshard_deepspeed": "reshard", "deepspeed_findings": "reshard", "parse_dp": "reshard", "parse_to": "reshard", "build_ptc": "meta",
})  # fmt: skip
