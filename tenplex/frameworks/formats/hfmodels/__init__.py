"""Megatron GPT checkpoints <-> Hugging Face transformers models (`--hf-arch`).

`export.export_hf`: a Megatron TP x PP checkpoint (torch_dist or legacy) consolidated into a
directory `from_pretrained` loads; `start.import_hf`: a Hugging Face model written as a Megatron
`torch_dist` tree for a TP x PP x DP job. Both use the per-architecture tables of `hf.names` and
the args <-> `config.json` translation of `hf.config`.
"""
