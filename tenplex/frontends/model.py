"""Transformer model specs: the architecture facts that decide which parameters exist and their shapes.

A `ModelSpec` describes a Megatron-style GPT, BERT or Llama model. It says nothing about
parallelism; `parallel.py` pairs it with a `ParallelConfig`.

Invariants (each raises `SpecError` quoting the values):
- kind is gpt, bert or llama; norm is layernorm or rmsnorm; optimizer is adam or none;
- num_layers, hidden, heads, query_groups, head_dim, ffn_hidden, vocab and
  make_vocab_size_divisible_by are positive integers; max_position and num_experts are >= 0;
- every size is at most its `LIMITS` entry: about 100x the largest published model (layers
  126, hidden 25600, heads 160, ffn 102400, vocab 256000, experts 256), so that a typo such as
  `layers=100000000` is refused at once instead of building for minutes;
- heads is a multiple of query_groups;
- head_dim defaults to hidden / heads, so then heads must divide hidden;
- dtype is a known floating dtype name;
- gpt and bert use learned absolute position embeddings (max_position > 0); llama uses RoPE
  (max_position == 0).
"""

from __future__ import annotations

import attrs

from tenplex.ir.errors import SpecError
from tenplex.ir.tensor import ITEMSIZE

KINDS = ("gpt", "bert", "llama")
NORMS = ("layernorm", "rmsnorm")
OPTIMIZERS = ("adam", "none")
FLOAT_DTYPES = tuple(d for d in ITEMSIZE if d.startswith(("float", "bfloat")))
LIMITS = {
    "num_layers": 1 << 14, "hidden": 1 << 22, "heads": 1 << 14, "query_groups": 1 << 14, "head_dim": 1 << 22,
    "ffn_hidden": 1 << 24, "vocab": 1 << 25, "make_vocab_size_divisible_by": 1 << 20, "max_position": 1 << 24,
    "num_experts": 1 << 15,
}  # fmt: skip


def _default_head_dim(spec: ModelSpec) -> int:
    if not all(isinstance(v, int) and v > 0 for v in (spec.hidden, spec.heads)):
        return 1  # the size check reports the bad hidden or heads
    if spec.hidden % spec.heads:
        raise SpecError(f"hidden={spec.hidden} is not divisible by heads={spec.heads}; give head_dim explicitly")
    return spec.hidden // spec.heads


@attrs.frozen
class ModelSpec:
    """A transformer's architecture. Fields left out take Megatron's defaults for the kind."""

    kind: str
    num_layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    query_groups: int = attrs.field(default=attrs.Factory(lambda s: s.heads, takes_self=True))
    head_dim: int = attrs.field(default=attrs.Factory(_default_head_dim, takes_self=True))
    max_position: int = 0
    glu: bool = False
    norm: str = "layernorm"
    bias_linear: bool = True
    tied_embeddings: bool = True
    dtype: str = "bfloat16"
    optimizer: str = "adam"
    num_experts: int = 0
    make_vocab_size_divisible_by: int = 128

    def __attrs_post_init__(self) -> None:
        self._verify_choices()
        self._verify_sizes()
        if self.heads % self.query_groups:
            raise SpecError(f"heads={self.heads} is not a multiple of query_groups={self.query_groups}")
        if self.kind in ("gpt", "bert") and self.max_position <= 0:
            raise SpecError(
                f"a {self.kind} model needs learned position embeddings: max_position={self.max_position} must be > 0"
            )
        if self.kind == "llama" and self.max_position:
            raise SpecError(
                f"a llama model uses RoPE and has no position embeddings: max_position={self.max_position} must be 0"
            )

    def _verify_choices(self) -> None:
        for field, value, allowed in (
            ("kind", self.kind, KINDS),
            ("norm", self.norm, NORMS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("dtype", self.dtype, FLOAT_DTYPES),
        ):
            if value not in allowed:
                raise SpecError(f"model {field}={value!r} is not one of {list(allowed)}")
        for field in ("glu", "bias_linear", "tied_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise SpecError(f"model {field}={getattr(self, field)!r} is not a boolean")

    def _verify_sizes(self) -> None:
        positive = (
            "num_layers",
            "hidden",
            "heads",
            "query_groups",
            "head_dim",
            "ffn_hidden",
            "vocab",
            "make_vocab_size_divisible_by",
        )
        for field in positive + ("max_position", "num_experts"):
            value = getattr(self, field)
            low = 1 if field in positive else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SpecError(f"model {field}={value!r} must be an integer >= {low}")
            if value > LIMITS[field]:
                raise SpecError(f"model {field}={value} exceeds the limit {LIMITS[field]} (100x the largest published model)")

    @property
    def qkv_rows(self) -> int:
        """Rows of the fused QKV weight: (np + 2·ng)·hn, in Megatron's grouped layout."""
        return (self.heads + 2 * self.query_groups) * self.head_dim

    @property
    def fc1_rows(self) -> int:
        """Rows of fc1: 2f with a gated (GLU) MLP, else f."""
        return 2 * self.ffn_hidden if self.glu else self.ffn_hidden

    @property
    def norm_has_bias(self) -> bool:
        return self.norm == "layernorm"

    @property
    def has_optimizer(self) -> bool:
        return self.optimizer != "none"
