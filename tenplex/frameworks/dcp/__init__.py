"""PyTorch Distributed Checkpoint (DCP) directories (`.metadata` + `*.distcp`) as PTCs.

`read_dcp` (read.py; index.py: `.metadata` as an index and PTC, without torch, through the
stand-ins of pickled.py) and `write_dcp` (write.py, the files DCP's writer would write; record.py: `torch.save`'s record of a tensor, without torch); `reshard_dcp`
(reshard.py) into a DTensor mesh layout (`dtensor.mesh`); `inspect_dcp` (describe.py, without torch); `load_dcp` (load.py):
tenplex as DCP's loader for one rank of a live job; apply.py applies a plan into buffers the
caller owns. Without files: `StoreWriter` / `StoreReader` (storage.py) are DCP's storage layer
in the host's tenplex store, `reshard_stored` moves such a state between the agents' stores,
stored.py is where it lives there. Errors are `DcpError`s naming the file (or store) and the key.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "DcpError": "format", "read_dcp": "read", "read_index": "index", "write_dcp": "write", "reshard_dcp": "reshard",
    "inspect_dcp": "describe", "load_dcp": "load", "StoreWriter": "storage", "StoreReader": "storage", "complete_save": "storage",
    "reshard_stored": "reshard",
})  # fmt: skip
