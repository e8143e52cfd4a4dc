"""PyTorch DTensor layouts as PTCs, torch-free where they can be.

- boxes.py: placements (`Shard`, `Replicate`) on a device mesh -> each rank's box (torch's rules);
- layout.py: a layout as a PTC (one partition per rank, one sub-tensor per (rank, FQN));
- mesh.py and stage.py: `tenplex.dtensor-layout/1` files (a mesh and placements per FQN, with
  `Stage(s)` for pipeline stages; `source_layout`: the layout a checkpoint has now);
- convert.py: torch <-> numpy, placements and local shards; values.py: non-tensor entries as values;
- state.py: live DTensor state dicts <-> PTC triples.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "Placement": "boxes", "PlacementError": "boxes", "Replicate": "boxes", "Shard": "boxes",
    "TensorSpec": "layout", "LocalShard": "layout", "ptc_from_specs": "layout", "MeshLayout": "mesh",
    "dst_ptc": "mesh", "source_layout": "mesh", "ptc_from_state_dicts": "state", "state_dicts_from_arrays": "state",
})  # fmt: skip
