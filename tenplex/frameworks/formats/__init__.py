"""Checkpoint formats by name, for `tenplex reshard --from/--format` and `tenplex inspect`.

Formats: `tenplex` (a directory with `ptc.json` + `<partition>/<path>.npy`, `runtime.reshard`),
`megatron` (a legacy Megatron-LM tree), `megatron-dist` (Megatron's `torch_dist`: a tree or a bare
dist_checkpointing directory; `--from megatron` takes it too), `dcp` (a PyTorch Distributed Checkpoint directory),
`deepspeed` (a DeepSpeed ZeRO-1/2 or universal checkpoint, `frameworks.deepspeed`), `hf` (Hugging Face
safetensors: `model.safetensors`, or shards named by `model.safetensors.index.json`); `structure` (the reference's per-rank
structure JSON: shapes only, so a PTC for `tenplex compile`/`inspect`, never a data source).
`detect(dir)` tells them apart by the files they must have. `convert(src, to, out)` reshards
SRC into the layout `to` and writes OUT in `fmt` (default: SRC's format):

- same format: the format's own reshard (`reshard`, `reshard_megatron`, `reshard_dcp`,
  `reshard_deepspeed`);
- another format: read SRC into a PTC triple, move it into the dst PTC (`reshard_arrays`), and
  write that with the target format's writer. Megatron output needs a Megatron source (the
  args, names and optimizer structure come from it).

With `hf_arch` (`--hf-arch llama`), `convert` maps names and layouts between Megatron GPT models
and transformers architectures (`hf.names`): a Megatron source into a Hugging Face model that
`from_pretrained` loads (`hfmodels.export`), or a Hugging Face model into a Megatron `torch_dist` tree
(`hfmodels.start`).

`convert` returns a `Converted` (the facts `tenplex reshard` prints as a line, or as JSON with
`--json`); `inspect_report(dir)` returns the format, the findings and the PTC that `inspect`
describes, for `tenplex inspect --json`.

`to` means what the source format means by a layout: `dp=N` for DeepSpeed, `tp=4,pp=1[,dp=2][,vpp=2]` for Megatron
(the model stays the checkpoint's), a DTensor layout JSON (file or text) for DCP, a PTC JSON
file or model spec for tenplex; a PTC JSON file or model spec is accepted for any source. Output
in `hf` is one whole model: `to` is `whole` or `max_shard_size=SIZE` (`hf.write.parse_target`).

Trust: Megatron rank files and DCP `.metadata` are pickles. They are unpickled with allow-lists
of the classes those formats hold (`megatron.pickles`, `dcp.metadata`); `trust_pickles=True`
(`--trust-pickles`) lifts the lists for checkpoints from a trusted source. `inspect` raises when
a checkpoint cannot be read (the CLI exits 2): only a readable checkpoint is described.

Modules: `kinds` (the formats by name and how a directory is told apart), `conversion` (read a
source, the dst layout, reshard and write), `findings` (plain words for `inspect`), `hfmodels`
(Megatron <-> Hugging Face models: `export`, `start`).
"""

from tenplex._lazy import lazy

# lazily (`tenplex._lazy`), as the other framework packages: `tenplex reshard` of a tenplex
# directory needs `detect` alone, not the conversions' module
__getattr__, __all__ = lazy(__name__, {
    "Converted": "conversion", "convert": "conversion", "dst_ptc": "conversion", "read": "conversion",
    "inspect": "findings", "inspect_report": "findings", "FORMATS": "kinds", "FormatError": "kinds", "detect": "kinds",
})  # fmt: skip
