"""Framework adapters: the checkpoints of training frameworks as PTCs, and back.

- `megatron/`: Megatron-LM legacy trees (`iter_*/mp_rank_*/model_optim_rng.pt`, distributed optimizer);
- `dtensor/`: PyTorch DTensor layouts and live state dicts (placements -> boxes, mesh layouts, values);
- `dcp/`: PyTorch Distributed Checkpoint directories (`.metadata` + `*.distcp`), and `load_dcp`;
- `hf/`: Hugging Face safetensors directories (`save_pretrained`, DCP's `HuggingFaceStorageWriter`);
- `structure/`: the reference Tenplex's per-rank structure JSON;
- `formats`: the formats by name, for `tenplex reshard --from/--format` and `tenplex inspect`.

Names resolve lazily, so importing the package imports neither torch nor an adapter.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "CheckpointFormatError": "megatron", "read_megatron": "megatron", "write_megatron": "megatron",
    "reshard_megatron": "megatron", "inspect_megatron": "megatron", "parse_layout": "megatron",
    "read_dcp": "dcp", "write_dcp": "dcp", "reshard_dcp": "dcp", "inspect_dcp": "dcp", "load_dcp": "dcp",
    "DcpError": "dcp", "ptc_from_state_dicts": "dtensor", "state_dicts_from_arrays": "dtensor",
    "read_structure": "structure", "write_structure": "structure", "inspect_structure": "structure",
    "StructureError": "structure", "read_hf": "hf", "write_hf": "hf", "inspect_hf": "hf", "HfError": "hf",
})  # fmt: skip
