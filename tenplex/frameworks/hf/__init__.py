"""Hugging Face safetensors checkpoints (`save_pretrained`, DCP's `HuggingFaceStorageWriter`) as PTCs.

`read_hf` (read.py: a directory of `.safetensors` files, with or without
`model.safetensors.index.json`) and `write_hf` (write.py: one whole model, single file or
sharded with an index); header.py parses one file's header and maps its tensors with numpy
(the `safetensors` package is never imported); inspect.py describes a directory in words.
names.py maps Megatron GPT tensors to a transformers architecture's and back (one table per
architecture), config.py turns Megatron-LM's args into `config.json` and back. Errors are
`HfError`s naming the file and the field.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "HfError": "errors", "read_hf": "read", "read_index": "read", "write_hf": "write", "whole_ptc": "write",
    "parse_target": "write", "read_header": "header", "inspect_hf": "inspect", "to_hf": "names", "from_hf": "names",
    "llama_config": "config", "megatron_args": "config", "megatron_dims": "config",
})  # fmt: skip
