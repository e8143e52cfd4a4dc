"""Read a Megatron-LM legacy checkpoint tree into the PTC triple (PTC, arrays, values).

The model and layout come from the `args` of rank (tp 0, pp 0) (`megatron.args`); the PTC is the
frontend's `build_ptc` for that job on one host. Every rank file is then checked against it:
chunk keys (`model` or `model0..`), parameter keys in the file's naming (`megatron.names`),
TP-local shapes and dtypes, Adam state bound by name (`megatron.optim`) or the distributed
optimizer's world buffers cut into the PTC's DP fragments (`megatron.distrib`).

QKV in checkpoint_version < 2.0 (0: per rank `[Q_r; K_r; V_r]`; 1.0: `[np_r, hn, 3]`) is
permuted per rank, weights and their Adam state alike, into the grouped layout
(`fix_query_key_value_ordering` in Megatron's checkpointing.py); the writer writes version 3.0.

Invariants: nothing is returned unless every sub-tensor of the PTC has an array of its local
shape and dtype, every file key is accounted for, and every rank agrees on the iteration;
otherwise CheckpointFormatError names the file and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.megatron.args import model_from_args, parallel_from_args
from tenplex.frameworks.megatron.distrib import bucket_size, chunk_layout, fragments, read_buffers
from tenplex.frameworks.megatron.meta import MegatronCheckpoint, MegatronMeta, cluster_for
from tenplex.frameworks.megatron.names import Naming, detect_naming, extra_module, flatten, is_chunk_key
from tenplex.frameworks.megatron.optim import Groups, distrib_groups, first_appearance, read_adam
from tenplex.frameworks.megatron.rng import rng_layout
from tenplex.frameworks.megatron.tensors import to_numpy
from tenplex.frameworks.megatron.tree import CheckpointFormatError, Tree, check_rank_dirs, load_file, open_tree
from tenplex.frontends.layout import Rule, shard
from tenplex.frontends.optimizer import optim_kinds, optim_tensor
from tenplex.frontends.parallel import fit
from tenplex.frontends.transformer import Stage, build_ptc, model_partition_id, stage_params
from tenplex.ir.errors import SpecError
from tenplex.runtime.arrays import np_dtype

_OWN = ("args", "checkpoint_version", "iteration", "optimizer", "rng_state")


def read_megatron(src_dir: str | os.PathLike, *, vocab: int | None = None, trust_pickles: bool = False) -> MegatronCheckpoint:
    """The checkpoint at `src_dir` (the directory holding latest_checkpointed_iteration.txt).
    `vocab` is the true vocabulary size when args does not say it; `trust_pickles` lets rank
    files unpickle any class (`megatron.pickles`; only for files from a trusted source).

    Raises:
        CheckpointFormatError: naming the file and the key that does not match the layout, or
            the file and the class its pickle needs outside the allow-list.
    """
    tree = open_tree(src_dir)
    head_file, head = _head(tree, trust_pickles)
    args = head.get("args")
    model = model_from_args(args, head_file, vocab=vocab, optimizer="optimizer" in head)
    parallel = parallel_from_args(args, head_file)
    if not model.has_optimizer:  # saved with --no-save-optim: nothing to shard over DP
        parallel = attrs.evolve(parallel, zero=0)
    try:
        parallel = fit(model, parallel, cluster_for(parallel))
    except SpecError as e:
        raise CheckpointFormatError(f"{head_file}: key 'args' describes a layout that does not fit the model: {e}") from None
    check_rank_dirs(tree, parallel.tp, parallel.pp)
    reader = _Reader(tree, model, parallel, head, trust_pickles)
    for pp in range(parallel.pp):
        stage = stage_params(model, parallel, pp)
        for tp in range(parallel.tp):
            file = tree.model_file(tp, pp, parallel.pp)
            data = head if (pp, tp) == (0, 0) else load_file(file, f"rank tp={tp}, pp={pp}", trust_pickles=trust_pickles)
            reader.rank(file, data, stage, pp, tp)
    return reader.result(vocab is not None or isinstance(getattr(args, "vocab_size", None), int))


def _head(tree: Tree, trust_pickles: bool) -> tuple[Path, dict]:
    for pp_size in (1, 2):
        file = tree.model_file(0, 0, pp_size)
        if os.path.lexists(file):
            data = load_file(file, "rank tp=0, pp=0", trust_pickles=trust_pickles)
            if not isinstance(data, dict) or "args" not in data:
                raise CheckpointFormatError(f"{file}: key 'args' missing")
            return file, data
    raise CheckpointFormatError(f"{tree.model_file(0, 0, 1)}: missing (nor is there {tree.model_file(0, 0, 2)})")


def qkv_v2(a: np.ndarray, version: float, heads_local: int, head_dim: int) -> np.ndarray:
    """A rank's QKV rows in the grouped (>= 2.0) layout from checkpoint_version `version`."""
    if version >= 2.0:
        return a
    rest = a.shape[1:]
    if version == 0:
        x = a.reshape(3, heads_local, head_dim, *rest).swapaxes(0, 1)
    else:
        x = a.reshape(heads_local, head_dim, 3, *rest).swapaxes(1, 2)
    return np.ascontiguousarray(x).reshape(a.shape)


class _Reader:
    """Accumulates arrays, values and the meta facts of the rank files."""

    def __init__(self, tree: Tree, model, parallel, head: dict, trust_pickles: bool):
        self.tree, self.model, self.parallel, self.head = tree, model, parallel, head
        self.trust_pickles = trust_pickles
        self.ptc = build_ptc(model, parallel, cluster_for(parallel))
        self.arrays: dict[str, np.ndarray] = {}
        self.values: dict[str, dict[str, Any]] = {p.id: {} for p in self.ptc.partitions}
        self.version = float(head.get("checkpoint_version", 0))
        self.naming: Naming | None = None
        self.extra: set[str] = set()
        self.groups: list[tuple[Groups, tuple[bool, ...]]] = []
        self.dtype_key: Any = None

    def rank(self, file: Path, data: Any, stage: Stage, pp: int, tp: int) -> None:
        if not isinstance(data, dict):
            raise CheckpointFormatError(f"{file}: holds {type(data).__name__}, expected a state dict")
        pid = model_partition_id(self.parallel, pp, tp)
        iteration = data.get("iteration", data.get("total_iters"))
        if not isinstance(iteration, int) or iteration != self.head.get("iteration", self.head.get("total_iters")):
            raise CheckpointFormatError(f"{file}: key 'iteration' is {iteration!r}, rank tp=0, pp=0 says "
                                        f"{self.head.get('iteration')!r}")  # fmt: skip
        rng = self.ptc.partition_map[pid].value_map["rng"].value
        self.values[pid] = {"iteration": iteration, "rng": rng}
        self._chunks(file, data, stage, pid, tp)
        if self.model.has_optimizer:
            self._optimizer(file, data, stage, pp, tp)

    def _chunks(self, file: Path, data: dict, stage: Stage, pid: str, tp: int) -> None:
        want = {chunk.prefix for chunk, _ in stage}
        got = {k for k in data if is_chunk_key(k)}
        for key in sorted(want ^ got):
            raise CheckpointFormatError(f"{file}: key {key!r} " + ("missing" if key in want else
                                        f"unexpected with vpp={self.parallel.vpp}"))  # fmt: skip
        for chunk, params in stage:
            flat = flatten(data[chunk.prefix]) if isinstance(data[chunk.prefix], dict) else None
            if flat is None:
                raise CheckpointFormatError(f"{file}: key {chunk.prefix!r} is not a dict")
            naming = self._naming(file, flat)
            wanted = {naming.key(p.key): p for p in params}
            for key in sorted(flat.keys() - wanted.keys()):
                self._extra_key(file, naming, f"{chunk.prefix}/{key}", key)
            for key, param in wanted.items():
                if key not in flat:
                    raise CheckpointFormatError(f"{file}: key '{chunk.prefix}/{key}' missing (parameter {param.label!r})")
                self.arrays[f"{pid}/{param.label}"] = self._param(file, f"{chunk.prefix}/{key}", flat[key], param, tp)

    def _naming(self, file: Path, flat: dict) -> Naming:
        found = detect_naming(flat)
        if self.naming is None and found is not None:
            self.naming = found
        if self.naming is None or (found is not None and found.family != self.naming.family):
            raise CheckpointFormatError(f"{file}: model keys {sorted(flat)[:3]} are neither legacy nor mcore "
                                        f"names of one family")  # fmt: skip
        return self.naming

    def _extra_key(self, file: Path, naming: Naming, where: str, key: str) -> None:
        module = extra_module(key) if naming.family == "mcore" else None
        if module is None:
            raise CheckpointFormatError(f"{file}: unknown key {where!r} (no parameter of the {self.model.kind} model)")
        self.extra.add(module)

    def _param(self, file: Path, key: str, value: Any, param, tp: int) -> np.ndarray:
        a = to_numpy(value, file, key)
        layout = shard(param.shape, param.rule, self.parallel.tp, tp, self.model.make_vocab_size_divisible_by)
        if a.shape != layout.shape or a.dtype != np_dtype(self.model.dtype):
            raise CheckpointFormatError(f"{file}: key {key!r} is {a.dtype}{list(a.shape)}, expected "
                                        f"{self.model.dtype}{list(layout.shape)} (tp={self.parallel.tp})")  # fmt: skip
        return self._fix_qkv(a, param)

    def _fix_qkv(self, a: np.ndarray, param) -> np.ndarray:
        if param.rule is not Rule.QKV or self.version >= 2.0:
            return a
        if self.model.query_groups != self.model.heads:
            raise CheckpointFormatError(f"checkpoint_version {self.version} predates grouped-query attention")
        return qkv_v2(a, self.version, self.model.heads // self.parallel.tp, self.model.head_dim)

    def _optimizer(self, file: Path, data: dict, stage: Stage, pp: int, tp: int) -> None:
        if "optimizer" not in data:
            raise CheckpointFormatError(f"{file}: key 'optimizer' missing (rank tp=0, pp=0 has optimizer state)")
        naming = self.naming or Naming()
        ordered = [p for _, params in stage for p in naming.order(params)]
        if self.parallel.zero:
            groups = distrib_groups(data["optimizer"], file)
            self._distrib(file.parent / "distrib_optim.pt", stage, pp, tp)
        else:
            groups = self._adam(file, data["optimizer"], ordered, pp, tp)
        self.groups.append((groups, first_appearance(ordered)))

    def _adam(self, file: Path, value: Any, ordered: list, pp: int, tp: int) -> Groups:
        par, model = self.parallel, self.model
        shapes = {p.label: shard(p.shape, p.rule, par.tp, tp, model.make_vocab_size_divisible_by).shape for p in ordered}
        tensors, groups = read_adam(value, ordered, shapes, model.dtype != "float32", file)
        pid = model_partition_id(par, pp, tp)
        for p in ordered:
            for kind in optim_kinds(model):
                self.arrays[f"{pid}/{optim_tensor(kind, p.label)}"] = self._fix_qkv(tensors[p.label][kind], p)
        return groups

    def _distrib(self, file: Path, stage: Stage, pp: int, tp: int) -> None:
        par, model, naming = self.parallel, self.model, self.naming or Naming()
        layouts = [chunk_layout(model, naming.order(params), par.tp, par.pp, par.dp,
                                bucket_size(self.head["args"], par.dp, pp, chunk.vp)) for chunk, params in stage]  # fmt: skip
        data = load_file(file, f"distributed optimizer of tp={tp}, pp={pp}", trust_pickles=self.trust_pickles)
        flat, self.dtype_key = read_buffers(data, layouts, file)
        for d, items in fragments(model, stage, par.tp, par.dp).items():
            for label, start, stop in items:
                for kind in optim_kinds(model):
                    sid = f"pp{pp}-tp{tp}-dp{d}/{optim_tensor(kind, label)}"
                    self.arrays[sid] = flat[label][kind][start:stop]

    def result(self, vocab_known: bool) -> MegatronCheckpoint:
        for st in self.ptc.subtensors:  # every sub-tensor was filled with its local shape
            a = self.arrays.get(st.id)
            if a is None or a.shape != st.shape:
                raise CheckpointFormatError(f"{self.tree.step_dir}: no array of shape {list(st.shape)} for sub-tensor {st.id!r}")
        meta = MegatronMeta(
            self.model, self.parallel, self.naming or Naming(), self.head["args"], self.version,
            self.tree.release, tuple(self.head), tuple((k, v) for k, v in self.head.items()
                                                       if k not in _OWN and not is_chunk_key(k)),
            frozenset(self.extra), *self._group_facts(), self.dtype_key, rng_layout(self.head.get("rng_state")),
            vocab_known,
        )  # fmt: skip
        return MegatronCheckpoint(self.ptc, self.arrays, self.values, meta)

    def _group_facts(self) -> tuple[Groups | None, tuple[bool, ...] | None]:
        if not self.groups:
            return None, None
        first = self.groups[0][0]
        templates: dict[bool, dict] = {}
        for g, _ in self.groups:  # the first file that has a class gives its template
            for c, template in g.templates:
                templates.setdefault(c, template)
        merged = Groups(tuple(templates.items()), first.order, first.state_keys, first.extras, first.scaler, first.chained)
        if not any("wd_mult" in t for t in templates.values()):
            return merged, (False, True)  # v2-era: always [decay, no decay]
        if all(g.order == appear for g, appear in self.groups):
            return merged, None
        orders = {g.order for g, _ in self.groups}
        if len(orders) > 1:
            raise CheckpointFormatError(f"{self.tree.step_dir}: param group orders {sorted(orders)} differ between "
                                        f"stages and follow no known rule")  # fmt: skip
        return merged, orders.pop()
