"""The reference Tenplex's per-rank structure JSON directories (`rank_map.json` + `rankNN/...`).

`read_structure`, `write_structure`, `inspect_structure` (read.py); the model measured from
tensor shapes (model.py, chunks.py); each rank file checked against the PTC (check.py); names
and JSON I/O (files.py); writing one from a Megatron tree (write.py).
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "StructureError": "files", "read_structure": "read", "write_structure": "read", "inspect_structure": "read",
})  # fmt: skip
