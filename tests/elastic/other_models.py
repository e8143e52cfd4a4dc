"""Two models that tenplex knows nothing of, made elastic by the public API alone (`Job.declare`,
`Job.save`/`load`): run by `test_any_model.py` through the controller and compared with a static
run. The training loop is the example's (`examples/elastic_gpt.py: run`), which takes any model
whose pipeline stages pass (batch, seq, hidden) activations.

- `tied`: a token MLP without attention: RMSNorm without bias, bias-free Linears named
  `layers.{i}.fc_in` / `fc_out`, and the output head tied to the embedding (`tok.weight`), so its
  stages cannot be split across a pipeline (pp 1 only).
- `untied`: other names and biases everywhere: `lookup` -> `encoder.units.{i}` (LayerNorm `ln`,
  `proj_a`, `proj_b` with biases) -> `final_norm` -> `decoder` (a Linear with bias).

    TENPLEX_TP=2 torchrun --nproc-per-node 2 tests/elastic/other_models.py --model untied --job-dir DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elastic_gpt as example  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Tied(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(nn.ModuleDict({"norm": RMSNorm(hidden), "fc_in": nn.Linear(hidden, 3 * hidden, bias=False),
                                                   "fc_out": nn.Linear(3 * hidden, hidden, bias=False)}) for _ in range(layers))  # fmt: skip
        self.out_norm = RMSNorm(hidden)

    def keep(self, owned: set[str]) -> None:
        assert {"tok", "out_norm"} <= owned, "the tied head needs the embedding on its stage (pp 1)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x)
        for layer in self.layers:
            h = h + layer["fc_out"](F.silu(layer["fc_in"](layer["norm"](h))))
        return F.linear(self.out_norm(h), self.tok.weight)

    @staticmethod
    def declare(job, layers: int):
        plan = {f"layers.{i}.{name}": style for i in range(layers) for name, style in (("fc_in", "colwise"), ("fc_out", "rowwise"))}
        return job.declare(plan, first=["tok"], layers=[f"layers.{i}" for i in range(layers)], last=["out_norm"])


class Unit(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.ln, self.proj_a, self.proj_b = nn.LayerNorm(hidden), nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj_b(F.gelu(self.proj_a(self.ln(x))))


class Encoder(nn.Module):
    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.units = nn.ModuleList(Unit(hidden) for _ in range(layers))


class Untied(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.lookup, self.encoder = nn.Embedding(vocab, hidden), Encoder(hidden, layers)
        self.final_norm, self.decoder = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)

    def keep(self, owned: set[str]) -> None:
        for name in ("lookup", "final_norm", "decoder"):
            if name not in owned:
                setattr(self, name, None)
        for i in range(len(self.encoder.units)):
            if f"encoder.units.{i}" not in owned:
                self.encoder.units[i] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lookup is not None:
            x = self.lookup(x)
        for unit in self.encoder.units:
            if unit is not None:
                x = unit(x)
        return x if self.decoder is None else self.decoder(self.final_norm(x))

    @staticmethod
    def declare(job, layers: int):
        plan = {f"encoder.units.{i}.{name}": style for i in range(layers) for name, style in (("proj_a", "colwise"), ("proj_b", "rowwise"))}
        return job.declare(plan, first=["lookup"], layers=[f"encoder.units.{i}" for i in range(layers)],
                           last=["final_norm", "decoder"])  # fmt: skip


MODELS = {"tied": Tied, "untied": Untied}


def build(args, job):
    torch.manual_seed(args.seed)
    cls = MODELS[args.model]
    return example.place(cls(args.vocab, args.hidden, args.layers), cls.declare(job, args.layers), job, args.lr)


if __name__ == "__main__":
    parser = example.parser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    example.run(parser.parse_args(), build)
