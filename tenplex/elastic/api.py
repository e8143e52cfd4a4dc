"""What a training program calls: a few lines in its loop make it elastic.

    job = tenplex.elastic.Job.from_env()           # set by the controller (and torchrun)
    par = job.declare(plan, first=[...], layers=[...], last=[...])   # how the model is split
    ... build this rank's part of the model for job.config (tp, dp, pp) and par.stages(pp) ...
    job.load(state_dict)                           # this generation's state, if any
    data = job.data(index, seed=0, global_batch=8, micro_batch=2)
    step = data.view.start
    while step < steps and not job.should_stop(step):
        ... train on data.view.step_at(step) ...; step += 1
    job.save(state_dict, data.state.at_step(data.order, step))

`Job.from_env` creates the job directory when it is missing (`jobdir`); the state goes through
the host's tenplex store or DCP files (`state`). Environment (the controller sets it; torchrun
sets RANK and WORLD_SIZE): TENPLEX_JOB_DIR, TENPLEX_GENERATION (default 0), TENPLEX_TP/DP/PP
(default: tp 1, pp 1, dp = WORLD_SIZE), TENPLEX_STOP_STEP (optional: stop before this step),
TENPLEX_FAIL_RANKS (optional: these ranks crash at the stop step, an injected failure),
TENPLEX_STORE, TENPLEX_JOB_NAME, TENPLEX_JOB_ID (the store; absent: DCP files).

A failure (`save` at the stop step with fail ranks): every rank joins a process group of the
survivors, then the failing ranks kill themselves (SIGKILL: no save, no cleanup, a real crash
that torchrun answers by tearing the job down). The survivors defer torchrun's SIGTERM while
they save what they hold (DCP over the survivors' group) and exit; the lowest surviving
rank writes the data state, the timings (with `failed` and `tensors`, the FQNs the whole job
held, so the controller can tell whether the survivors still cover the state) and `COMPLETE`.

Invariants:
- tp x dp x pp == world; rank r is at mesh coordinate (r // (dp tp), r // tp % dp, r % tp) of
  the (pp, dp, tp) mesh: its pipeline stage, data-parallel rank and tensor-parallel rank;
- `should_stop` returns the same answer on every rank (an all_reduce of the local answers);
- `saved/gen-N/COMPLETE` exists only once every rank's state and the data state are written.
Raises ElasticError naming the variable, file or field.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.jobdir import make_job_dir, metrics_file, saved_dir, state_dir, stop_file
from tenplex.elastic.layouts import PARALLEL, Parallelism, check_degree
from tenplex.elastic.state import StateHome

__all__ = ["Job", "JobData", "ParallelConfig", "make_job_dir", "metrics_file", "saved_dir", "state_dir", "stop_file", "tensor_names"]


@attrs.frozen
class ParallelConfig:
    """A parallel configuration: tensor, data and pipeline degrees."""

    tp: int = attrs.field(validator=lambda _, a, v: check_degree(a.name, v))
    dp: int = attrs.field(validator=lambda _, a, v: check_degree(a.name, v))
    pp: int = attrs.field(default=1, validator=lambda _, a, v: check_degree(a.name, v))

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def to_json(self) -> dict[str, int]:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp}


@attrs.frozen(eq=False)
class JobData:
    """This rank's view of the dataset for the current generation."""

    state: Any  # tenplex.data.DataState: the committed state this generation starts from
    order: Any  # tenplex.data.Order
    view: Any  # tenplex.data.RankView of this data-parallel rank, from the first step to run
    layout: Any  # tenplex.data.Layout: per-rank batch and accumulation steps


def _env_int(env: dict[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None:
        if default is None:
            raise ElasticError(f"{name}: the environment variable is not set (run under the tenplex job controller)")
        return default
    try:
        return int(text)
    except ValueError:
        raise ElasticError(f"{name}: expected an integer, got {text!r}") from None


def _ranks(env: dict[str, str], name: str) -> tuple[int, ...]:
    text = env.get(name, "").strip()
    try:
        return tuple(int(r) for r in text.split(",")) if text else ()
    except ValueError:
        raise ElasticError(f"{name}: expected comma-separated ranks, got {text!r}") from None


def tensor_names(state_dict: Any, prefix: str = "") -> list[str]:
    """The flattened FQNs (DCP's dotted keys) of the tensors in a nested state dict."""
    import torch

    if isinstance(state_dict, torch.Tensor):
        return [prefix]
    if isinstance(state_dict, dict):
        return [n for k, v in state_dict.items() for n in tensor_names(v, f"{prefix}.{k}" if prefix else str(k))]
    return []


@attrs.frozen(eq=False)
class Job:
    """One rank of one generation of an elastic job (see the module docstring)."""

    job_dir: Path = attrs.field(converter=Path)
    generation: int
    rank: int
    world: int
    config: ParallelConfig
    stop_step: int | None = None
    fail: tuple[int, ...] = ()
    home: StateHome = StateHome()  # where the state goes between generations (`state`)
    parallelism: Parallelism | None = attrs.field(default=None, init=False)  # `declare`
    _marks: dict[str, float] = attrs.field(factory=dict, init=False, repr=False)  # wall times (stop)

    def __attrs_post_init__(self) -> None:
        if self.config.world != self.world:
            raise ElasticError(f"TENPLEX_TP x TENPLEX_DP x TENPLEX_PP = {self.config.world} but WORLD_SIZE = {self.world}")
        if not 0 <= self.rank < self.world:
            raise ElasticError(f"RANK: {self.rank} is not in 0..{self.world - 1}")
        if any(not 0 <= r < self.world for r in self.fail) or len(self.fail) >= self.world:
            raise ElasticError(f"TENPLEX_FAIL_RANKS: {list(self.fail)} must be ranks in 0..{self.world - 1}, leaving a survivor")

    @classmethod
    def from_env(cls, job_dir: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Job:
        """The job of this process, from the environment (`job_dir` overrides TENPLEX_JOB_DIR).
        Creates the job directory (and its parents) when it is missing, so every rank can write
        into it from its first step; every check here runs before any collective.

        Raises:
            ElasticError: a variable is missing or wrong, or the job directory cannot be created
                or written to (naming it and the reason).
        """
        env = dict(os.environ if env is None else env)
        job_dir = job_dir or env.get("TENPLEX_JOB_DIR")
        if not job_dir:
            raise ElasticError("TENPLEX_JOB_DIR: the environment variable is not set and no job_dir was given")
        world = _env_int(env, "WORLD_SIZE", 1)
        tp, pp = _env_int(env, "TENPLEX_TP", 1), _env_int(env, "TENPLEX_PP", 1)
        config = ParallelConfig(tp, _env_int(env, "TENPLEX_DP", max(1, world // (tp * pp))), pp)
        stop = env.get("TENPLEX_STOP_STEP")
        job = cls(job_dir, _env_int(env, "TENPLEX_GENERATION", 0), _env_int(env, "RANK", 0), world, config,
                  None if stop in (None, "") else _env_int(env, "TENPLEX_STOP_STEP"), _ranks(env, "TENPLEX_FAIL_RANKS"),
                  StateHome.from_env(env))  # fmt: skip
        make_job_dir(job.job_dir)
        return job

    def declare(self, plan: dict[str, str], *, first: Sequence[str] = (), layers: Sequence[str] = (),
                last: Sequence[str] = ()) -> Parallelism:  # fmt: skip
        """Declare how this program parallelizes its model, once (see `layouts.Parallelism`): the
        tensor-parallel plan it gives `parallelize_module` and its pipeline split. `save` hands it
        to the controller, which derives every later layout from it. Returns it (its `stages(pp)`
        tells this program which modules its stage owns)."""
        par = Parallelism(plan, first, layers, last)
        object.__setattr__(self, "parallelism", par)
        return par

    @property
    def dp_rank(self) -> int:
        return self.rank // self.config.tp % self.config.dp

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage."""
        return self.rank // (self.config.tp * self.config.dp)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.config.tp

    @property
    def resuming(self) -> bool:
        """True when a generation before this one left state to load."""
        return self.home.resuming(self.job_dir, self.generation)

    def load(self, state_dict: dict[str, Any]) -> bool:
        """Fill `state_dict` (DTensors in this generation's layout) in place from this
        generation's state (the store's `state-N`, or the files in `state/gen-N`: `state`);
        False, touching nothing, when there is nothing to resume (generation 0)."""
        if not self.resuming:
            if self.generation > 0 and self.home.store is None and not state_dir(self.job_dir, self.generation).is_dir():
                raise ElasticError(f"{state_dir(self.job_dir, self.generation)}: generation {self.generation} has no state")
            return False  # generation 0, or a restart from the job's start (an empty state dir)
        start = time.time()
        self.home.load(state_dict, self.job_dir, self.generation, self.rank)
        self._marks["load_seconds"] = time.time() - start
        return True

    def data(self, index: Any, *, seed: int, global_batch: int, micro_batch: int, tail_policy: str = "drop") -> JobData:
        """This data-parallel rank's view from the committed data state (`state/gen-N/
        data_state.json` when resuming, checked against the index and settings; else the start)."""
        from tenplex.data import DataState, Layout, rank_view

        path = state_dir(self.job_dir, self.generation) / "data_state.json"
        doc = self.home.record(self.generation, "data_state")  # with the store: what the controller committed
        if doc is not None or path.exists():
            state = DataState.load(path) if doc is None else DataState.from_json(doc, f"{path.name} of generation {self.generation}")
            state.check_matches(str(path), fingerprint=index.fingerprint, seed=seed, global_batch=global_batch,
                                tail_policy=tail_policy)  # fmt: skip
        else:
            state = DataState.start(index, seed, global_batch, tail_policy)
        order = state.order_for(index, str(path))
        layout = Layout(global_batch, self.config.dp, micro_batch)
        return JobData(state, order, rank_view(state, order, self.config.dp, self.dp_rank), layout)

    def should_stop(self, step: int) -> bool:
        """True on every rank once the controller asked this generation to stop (the stop file,
        looked at by rank 0 only) or `step` reached TENPLEX_STOP_STEP; agreed by an all_reduce."""
        local = self.stop_step is not None and step >= self.stop_step
        if self.rank == 0 and not local:
            local = stop_file(self.job_dir, self.generation).exists()
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            if local:
                self._marks.setdefault("stop", time.time())
                self._marks.setdefault("stop_step", step)
            return local
        flag = torch.tensor([int(local)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = bool(flag.item())
        if stop:
            self._marks.setdefault("stop", time.time())
            self._marks.setdefault("stop_step", step)
        return stop

    @property
    def failing(self) -> bool:
        """True when this generation stopped at the step where its fail ranks crash."""
        return bool(self.fail) and self.stop_step is not None and self._marks.get("stop_step") == self.stop_step

    def save(self, state_dict: dict[str, Any], data_state: Any) -> Path:
        """Save this generation's state (every rank calls it): `dcp.save` with the default process
        group, then rank 0 writes the data state and timings and, last, `COMPLETE`. At an injected
        failure only the survivors save (see the module docstring); the failing ranks never return."""
        import torch.distributed as dist

        out = saved_dir(self.job_dir, self.generation)
        start = time.time()
        if self.failing and dist.is_initialized():
            return self._save_survivors(state_dict, data_state, out, start)
        self.home.save(state_dict, self.job_dir, self.generation)
        if dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            self._commit(out, data_state, start)
        if dist.is_initialized():
            dist.barrier()
        return out

    def _commit(self, out: Path, data_state: Any, start: float, **extra: Any) -> None:
        out.mkdir(parents=True, exist_ok=True)  # with the store, DCP wrote no files here
        if self.parallelism is not None:
            (out / PARALLEL).write_text(json.dumps(self.parallelism.to_json()))
        data_state.save(out / "data_state.json")
        timing = {**self._marks, "save_start": start, "save_end": time.time(), **extra}
        (out / "timing.json").write_text(json.dumps(timing))
        (out / "COMPLETE").write_text("")

    def _save_survivors(self, state_dict: dict[str, Any], data_state: Any, out: Path, start: float) -> Path:
        import signal

        import torch.distributed as dist

        signal.signal(signal.SIGTERM, lambda *_: None)  # torchrun's teardown waits for the save
        survivors = [r for r in range(self.world) if r not in self.fail]
        names: list[list[str]] = [[] for _ in range(self.world)]
        dist.all_gather_object(names, tensor_names(state_dict))
        group = dist.new_group(survivors)
        if self.rank in self.fail:
            print(f"rank {self.rank}: injected failure at step {self.stop_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        self.home.save(state_dict, self.job_dir, self.generation, group)
        dist.barrier(group=group)
        if self.rank == survivors[0]:
            self._commit(out, data_state, start, failed=list(self.fail), tensors=sorted({n for ns in names for n in ns}))
        dist.barrier(group=group)
        return out

    def log(self, **record: Any) -> None:
        """Append a JSON record (with generation and wall time) to metrics.jsonl; rank 0 only."""
        if self.rank != 0:
            return
        if "load_seconds" in self._marks:  # the first record after a load says how long it took
            record = {**record, "load_seconds": self._marks.pop("load_seconds")}
        line = json.dumps({**record, "generation": self.generation, "time": time.time()})
        with metrics_file(self.job_dir).open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)
