"""A tiny GPT trained with tensor, pipeline and data parallelism on CPU (gloo), made elastic by tenplex.

    TENPLEX_TP=T TENPLEX_DP=D torchrun --standalone --nproc-per-node W examples/elastic_gpt.py --job-dir DIR [--steps S]

Run it through `tenplex job run examples/elastic_gpt.yaml` (the job file beside it) to change W
while it trains. The mesh is (pp, dp, tp) from `tenplex.elastic.Job.config`; attention and MLP Linears are split Megatron-style with
DTensor's ColwiseParallel/RowwiseParallel, the plan the program declares once to tenplex
(`job.declare`, `parallelism` below: tenplex reshards with it, knowing nothing else of the model);
pipeline stage s keeps only its modules (the declaration's `stages(pp)`: contiguous blocks,
embeddings on the first stage, final norm and head on the last) and passes activations
forward and their gradients back with gloo send/recv, one micro-batch at a time; gradients are
summed over the dp mesh dim by hand. The global batch G is fixed: each dp rank takes G/dp samples
per step (tenplex.data) in micro-batches, and the loss is sum(per-sample loss) / G, so the step's
loss and update do not depend on W (up to floating-point reduction order). Rank 0 appends {step,
loss, W, tp, dp, pp, samples} to DIR/metrics.jsonl. Model init is a pure function of --seed (every
stage builds the whole model, then drops what other stages own); the data set (synthetic token
sequences, one .npy file per sample) is written once per host under DIR/dataset-<seed> (or
--data-dir).
DIR is created when missing; the program writes nothing outside DIR and --data-dir.

A wrong environment or job directory fails every rank at once, before any collective, with one
line `elastic_gpt.py: error: <what and where>` (exit 2); so does any tenplex error later on.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import attrs
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tenplex.data import DatasetIndex, build_index
from tenplex.data.reader import SampleReader
from tenplex.elastic import Job
from tenplex.ir.errors import TenplexError


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # under tensor parallelism q/k/v hold this rank's heads only: hidden/tp features
        q, k, v = (m(x).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(hidden), Attention(hidden, heads), nn.LayerNorm(hidden), Mlp(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, layers: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)

    def keep(self, owned: set[str]) -> None:
        """Drop the modules not in `owned` (FQN prefixes): this pipeline stage's model."""
        for name in ("emb", "pos", "ln_f", "head"):
            if name not in owned:
                setattr(self, name, None)
        for i in range(len(self.blocks)):
            if f"blocks.{i}" not in owned:
                self.blocks[i] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits on a whole model; on a stage, its input -> its output."""
        if self.emb is not None:
            x = self.emb(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return x if self.head is None else self.head(self.ln_f(x))


def write_dataset(root: Path, samples: int, seq: int, vocab: int, seed: int) -> None:
    """Token sequences t[i+1] = (a t[i] + c) mod vocab, (a, c) from a few rules: learnable."""
    rng = np.random.default_rng(seed)
    rules = rng.integers(1, vocab, size=(8, 2))
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    for i in range(samples):
        a, c = rules[rng.integers(len(rules))]
        tokens = np.empty(seq + 1, np.int64)
        tokens[0] = rng.integers(vocab)
        for j in range(seq):
            tokens[j + 1] = (a * tokens[j] + c) % vocab
        np.save(tmp / f"{i:06d}.npy", tokens)
    build_index([str(tmp)], "numpy").save(tmp / "index.npz")
    tmp.rename(root)


def dataset(args: argparse.Namespace, job: Job) -> DatasetIndex:
    root = Path(args.data_dir or job.job_dir / f"dataset-{args.seed}")
    if os.environ.get("LOCAL_RANK", str(job.rank)) == "0" and not root.exists():  # one writer per host
        write_dataset(root, args.samples, args.seq, args.vocab, args.seed)
    dist.barrier()
    return DatasetIndex.load(root / "index.npz").with_root(str(root))


def parallelism(job: Job, layers: int):
    """This model's parallelization, declared to tenplex: Megatron's attention and MLP split, and
    the pipeline split (embeddings first, the blocks in order, final norm and head last)."""
    plan: dict[str, str] = {}
    for i in range(layers):
        plan.update({f"blocks.{i}.attn.{n}": "colwise" for n in ("q", "k", "v")})
        plan.update({f"blocks.{i}.attn.o": "rowwise", f"blocks.{i}.mlp.up": "colwise", f"blocks.{i}.mlp.down": "rowwise"})
    return job.declare(plan, first=["emb", "pos"], layers=[f"blocks.{i}" for i in range(layers)], last=["ln_f", "head"])


@attrs.frozen
class Stage:
    """This rank's place in the pipeline: its neighbours' global ranks (None at the ends)."""

    prev: int | None
    next: int | None
    last_rank: int  # the last stage's rank with this rank's dp and tp coordinates
    group: dist.ProcessGroup | None  # this rank's pipeline (pp mesh dim), None when pp == 1


def build(args: argparse.Namespace, job: Job) -> tuple[nn.Module, torch.optim.Optimizer, dist.ProcessGroup, Stage]:
    torch.manual_seed(args.seed)  # every stage builds the whole model the same way, then keeps its part
    model = Gpt(args.vocab, args.seq, args.hidden, args.heads, args.layers)
    return place(model, parallelism(job, args.layers), job, args.lr)


def place(model: nn.Module, declared, job: Job, lr: float) -> tuple[nn.Module, torch.optim.Optimizer, dist.ProcessGroup, Stage]:
    """This rank's part of `model` (any model with `keep(owned module prefixes)`): its pipeline
    stage, its tensor-parallel modules split as declared, an optimizer and its pipeline links."""
    c = job.config
    mesh = init_device_mesh("cpu", (c.pp, c.dp, c.tp), mesh_dim_names=("pp", "dp", "tp"))
    owned = {m for m, s in declared.stages(c.pp).items() if s == job.pp_rank}
    model.keep(owned)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    mine = lambda fqn: any(fqn == m or fqn.startswith(m + ".") for m in owned)  # noqa: E731
    model = parallelize_module(model, mesh["tp"], {fqn: styles[style]() for fqn, style in declared.plan.items() if mine(fqn)})
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=False)
    step = c.dp * c.tp  # ranks between consecutive stages
    stage = Stage(job.rank - step if job.pp_rank > 0 else None, job.rank + step if job.pp_rank < c.pp - 1 else None,
                  job.rank + (c.pp - 1 - job.pp_rank) * step, mesh.get_group("pp") if c.pp > 1 else None)  # fmt: skip
    return model, optim, mesh.get_group("dp"), stage


def micro_step(model: nn.Module, stage: Stage, tokens: torch.Tensor, hidden: int, global_count: int) -> torch.Tensor:
    """Forward and backward of one micro-batch through this stage; the loss sum on the last."""
    if stage.prev is None:
        x = tokens[:, :-1]
    else:
        x = torch.empty(tokens.shape[0], tokens.shape[1] - 1, hidden)
        dist.recv(x, stage.prev)
        x.requires_grad_()
    out = model(x)
    loss_sum = torch.zeros(())
    if stage.next is None:
        per_token = F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
        loss_sum = per_token.view(len(tokens), -1).mean(1).sum()
        (loss_sum / global_count).backward()
    else:
        dist.send(out.detach().contiguous(), stage.next)
        grad = torch.empty_like(out)
        dist.recv(grad, stage.next)
        out.backward(grad)
    if stage.prev is not None:
        dist.send(x.grad.contiguous(), stage.prev)
    return loss_sum.detach()


def train_step(model: nn.Module, optim: torch.optim.Optimizer, dp_group: dist.ProcessGroup, stage: Stage,
               reader: SampleReader, rank_step, micro_steps: int, global_count: int, hidden: int) -> float:  # fmt: skip
    """One optimizer step on this rank's share; returns the global-batch mean loss."""
    optim.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for ids in rank_step.micro_batches(micro_steps):
        if len(ids) == 0:
            continue
        tokens = torch.from_numpy(np.stack([reader[int(i)] for i in ids]))
        total += micro_step(model, stage, tokens, hidden, global_count)
    for p in model.parameters():
        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(grad, group=dp_group)
    dist.all_reduce(total, group=dp_group)
    if stage.group is not None:  # the loss is known on the last stage
        dist.broadcast(total, stage.last_rank, group=stage.group)
    optim.step()
    return total.item() / global_count


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, help="where the job keeps its files (created when missing)")
    parser.add_argument("--data-dir", help="the data set's directory (default JOB_DIR/dataset-SEED, written once)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(parser().parse_args(argv), build)


def run(args: argparse.Namespace, build_fn: Callable) -> None:
    """Train with the model `build_fn(args, job)` makes (any model whose stages take and give
    (batch, seq, hidden) activations; `build` is this GPT's)."""
    torch.set_num_threads(1)
    try:
        job = Job.from_env(args.job_dir)  # checks the environment, creates the job directory
    except TenplexError as e:
        fail(e)
    dist.init_process_group("gloo")
    try:
        train(args, job, build_fn)
    except TenplexError as e:
        dist.destroy_process_group()
        fail(e)
    except BaseException:
        dist.destroy_process_group()
        raise
    # The state is saved and every rank passed save's last barrier. Tearing down gloo's sub-groups
    # at interpreter exit sometimes aborts a rank ("terminate called without an active
    # exception"), which torchrun would report as a failure: leave without C++ destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(args: argparse.Namespace, job: Job, build_fn: Callable = build) -> None:
    """Resume or start, train to --steps or the controller's stop, save."""
    index = dataset(args, job)
    model, optim, dp_group, stage = build_fn(args, job)
    if job.resuming:
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd}
        job.load(state)
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    data = job.data(index, seed=args.seed, global_batch=args.global_batch, micro_batch=args.micro_batch)
    reader = SampleReader(index)
    step = data.view.start
    while step < args.steps and not job.should_stop(step):
        rank_step = data.view.step_at(step)
        loss = train_step(model, optim, dp_group, stage, reader, rank_step, data.layout.accumulation_steps,
                          rank_step.global_count, args.hidden)  # fmt: skip
        shares = [None] * job.config.dp
        dist.all_gather_object(shares, rank_step.ids.tolist(), group=dp_group)
        job.log(step=step, loss=loss, W=job.world, tp=job.config.tp, dp=job.config.dp, pp=job.config.pp,
                samples=[i for share in shares for i in share])  # fmt: skip
        if not math.isfinite(loss):
            raise SystemExit(f"step {step}: loss {loss} is not finite")
        step += 1
    model_sd, optim_sd = get_state_dict(model, optim)
    job.save({"model": model_sd, "optim": optim_sd}, data.state.at_step(data.order, step))


def fail(error: TenplexError) -> NoReturn:
    """One line on stderr (torchrun prefixes the rank), exit 2: no traceback for a known error."""
    print(f"{Path(__file__).name}: error: {error}", file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
