"""Frontends: parsers that produce PTCs. `transformer` builds the exact per-rank PTC of a
Megatron-style transformer job from a model spec, a parallel config and a cluster."""

from tenplex.frontends.layout import Layout, Rule, flat_fragment, padded_vocab, shard
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.optimizer import Buffer, optim_tensor, stage_buffers
from tenplex.frontends.parallel import Cluster, ParallelConfig, fit
from tenplex.frontends.params import Param, chunk_params
from tenplex.frontends.pipeline import Chunk, chunks, stage_layer_counts
from tenplex.frontends.presets import PRESETS, model_from_fields, preset
from tenplex.frontends.spec import JobSpec, job_from_spec, load_spec, parse_spec, ptc_from_spec, spec_from_json
from tenplex.frontends.transformer import build_ptc, model_partition_id, stage_params
from tenplex.frontends.zero import Bucket, bucket_layout

__all__ = [
    "PRESETS", "Bucket", "Buffer", "Chunk", "Cluster", "JobSpec", "Layout", "ModelSpec", "ParallelConfig",
    "Param", "Rule", "bucket_layout", "build_ptc", "chunk_params", "chunks", "fit", "flat_fragment",
    "job_from_spec", "load_spec", "model_from_fields", "model_partition_id", "optim_tensor", "padded_vocab",
    "parse_spec", "preset", "ptc_from_spec", "shard", "spec_from_json", "stage_buffers", "stage_layer_counts",
    "stage_params",
]  # fmt: skip
