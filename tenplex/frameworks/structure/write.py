"""Write a structure directory (docs/reference-tenplex.md §2.3) for a layout: from a Megatron checkpoint tree
(each rank file torch.load'ed and converted by the reference's rules) or from a PTC (the rank
files Megatron 23.06 would save for it).

Both write `rank_map.json` (every rank, Megatron's order), `rankNN/mp_rank_MM[_PPP].json` for the
dp_rank-0 ranks and `model_keys.json` (`structure.files.model_key_paths`), with json.dump's
indent of 4, as the reference does.

From a PTC, keys are Megatron 23.06's legacy names (`input_layernorm`, `final_layernorm`: the
reference's key rules match those exact names), the optimizer is 23.06's: param groups
[weight decay, no weight decay] (an empty one left out) holding apex FusedAdam's fields, state
`{exp_avg, exp_avg_sq}` per index, `fp32_from_fp16_params` and (fp16) `grad_scaler` for 16-bit
models. Non-tensor leaves (`args`, the scheduler, RNG states) are placeholders of the right
shape: the reference takes their values from the source checkpoint, only their keys matter.

Invariants: the output directory is complete or absent (`atomic_dir`); layouts a structure
cannot describe (distributed optimizer, expert parallelism) are refused with StructureError.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tenplex.frameworks.megatron.args import parallel_from_args
from tenplex.frameworks.megatron.names import Naming, is_chunk_key
from tenplex.frameworks.megatron.tree import atomic_dir, load_file, open_tree
from tenplex.frameworks.structure.files import (
    MODEL_KEYS,
    NOT_PRIMITIVE,
    RANK_MAP,
    RankMap,
    StructureError,
    as_structure_error,
    dump_json,
    model_key_paths,
    rank_dir_name,
    rank_file_name,
    to_structure,
)
from tenplex.ir.ptc import PTC, Partition
from tenplex.ir.tensor import SubTensor

Ranks = dict[int, tuple[str, dict]]  # global rank -> (rank file name, converted checkpoint)
_PID = re.compile(r"pp(\d+)-tp(\d+)")
_NAMES_2306 = Naming("legacy", old_norms=True)
_RNG = [{"random_rng_state": [3, [0] * 625, None], "np_rng_state": ["MT19937", NOT_PRIMITIVE, 624, 0, 0.0],
         "torch_rng_state": {"tensor": [5056]}, "cuda_rng_state": {"tensor": [16]},
         "rng_tracker_states": {"model-parallel-rng": {"tensor": [16]}}}]  # fmt: skip
_SCHEDULER = {"max_lr": 0.0, "lr_warmup_steps": 0, "num_steps": 0, "lr_decay_style": "cosine", "lr_decay_steps": 0,
              "min_lr": 0.0, "start_wd": 0.0, "end_wd": 0.0, "wd_incr_style": "constant", "wd_incr_steps": 0}  # fmt: skip


def write_structure(src: PTC | str | os.PathLike, out_dir: str | os.PathLike, *, trust_pickles: bool = False) -> Path:
    """Write the structure directory of `src` (a PTC, or a Megatron checkpoint directory holding
    latest_checkpointed_iteration.txt, its rank files unpickled as `read_megatron` does) to
    `out_dir`, which must not exist; returns it.

    Raises:
        StructureError: `out_dir` exists, the checkpoint is unreadable, or the layout is one a
            structure cannot describe.
    """
    grid, ranks = from_ptc(src) if isinstance(src, PTC) else from_tree(Path(src), trust_pickles=trust_pickles)
    out = Path(out_dir)
    with as_structure_error(), atomic_dir(out) as tmp:
        dump_json(tmp / RANK_MAP, grid.to_json())
        for rank, (name, struct) in ranks.items():
            dump_json(tmp / rank_dir_name(rank) / name, struct)
        keys = {
            str(rank): model_key_paths(struct, out / rank_dir_name(rank) / name)
            for rank, (name, struct) in ranks.items()
        }
        dump_json(tmp / MODEL_KEYS, keys)
    return out


def from_tree(root: Path, *, trust_pickles: bool = False) -> tuple[RankMap, Ranks]:
    """The grid and converted rank files of a Megatron legacy checkpoint tree (`trust_pickles`:
    see `megatron.pickles`).

    Raises:
        StructureError: the tree is unreadable, or saved with the distributed optimizer.
    """
    with as_structure_error():
        tree = open_tree(root)
        head_file = next(
            (f for f in (tree.model_file(0, 0, n) for n in (1, 2)) if f.is_file()), tree.model_file(0, 0, 1)
        )
        head = load_file(head_file, "rank tp=0, pp=0", trust_pickles=trust_pickles)
        parallel = parallel_from_args(head.get("args") if isinstance(head, dict) else None, head_file)
    if parallel.zero:
        raise StructureError(f"{head_file}: key 'args' asks for the distributed optimizer, whose state "
                             f"(distrib_optim.pt) structures do not describe")  # fmt: skip
    grid = RankMap(parallel.tp, parallel.pp, int(parallel.dp or 1))
    out: Ranks = {}
    for pp in range(grid.pp):
        for tp in range(grid.tp):
            file = tree.model_file(tp, pp, grid.pp)
            with as_structure_error():
                data = head if (pp, tp) == (0, 0) else load_file(file, f"rank tp={tp}, pp={pp}", trust_pickles=trust_pickles)
            out[grid.rank(pp, tp)] = (rank_file_name(tp, pp, grid.pp), to_structure(data))
    return grid, dict(sorted(out.items()))


def from_ptc(ptc: PTC) -> tuple[RankMap, Ranks]:
    """The grid and the rank files Megatron 23.06 would save for `ptc` (a frontend PTC).

    Raises:
        StructureError: a partition other than `pp{p}-tp{t}`, an incomplete grid, DP replica
            counts that differ, or a sub-tensor that is neither a model key nor optimizer state.
    """
    parts: dict[tuple[int, int], Partition] = {}
    for part in ptc.partitions:
        m = _PID.fullmatch(part.id)
        if m is None:
            raise StructureError(f"partition {part.id!r}: structures describe only pp<p>-tp<t> model partitions "
                                 f"(no distributed optimizer, no expert parallelism)")  # fmt: skip
        parts[int(m[1]), int(m[2])] = part
    pp, tp = (1 + max(k[i] for k in parts) for i in (0, 1))
    replicas = {len(ptc.allocation.devices_of(p.id)) for p in parts.values()}
    if len(parts) != pp * tp or len(replicas) != 1:
        raise StructureError(f"partitions {sorted(p.id for p in parts.values())} are not a full pp x tp grid with one "
                             f"DP replica count (counts {sorted(replicas)})")  # fmt: skip
    grid = RankMap(tp, pp, replicas.pop())
    out = {grid.rank(p, t): (rank_file_name(t, p, pp), _rank(ptc, parts[p, t])) for p, t in sorted(parts)}
    return grid, dict(sorted(out.items()))


def _rank(ptc: PTC, part: Partition) -> dict:
    subs = [ptc.subtensor_map[sid] for sid in part.subtensors]
    params = [st for st in subs if is_chunk_key(st.path.split("/", 1)[0])]
    for st in subs:
        if st not in params and not st.path.startswith("optimizer/"):
            raise StructureError(f"sub-tensor {st.id!r}: path {st.path!r} is neither a Megatron model key nor "
                                 f"optimizer state")  # fmt: skip
    iteration = part.value_map["iteration"].value if "iteration" in part.value_map else None
    out: dict[str, Any] = {"args": NOT_PRIMITIVE, "checkpoint_version": 3.0,
                           "iteration": iteration if isinstance(iteration, int) else 0}  # fmt: skip
    for st in params:
        chunk, key = st.path.split("/", 1)
        *parents, leaf = _NAMES_2306.key(key).split("/")
        node = out.setdefault(chunk, {})
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = {"tensor": list(st.shape)}
    if len(params) < len(subs):
        out["optimizer"] = _optimizer(ptc, params)
        out["opt_param_scheduler"] = dict(_SCHEDULER)
    out["rng_state"] = _RNG
    return out


def _no_decay(ptc: PTC, st: SubTensor) -> bool:
    return st.path.endswith(".bias") or len(ptc.tensor_map[st.tensor].shape) == 1


def _optimizer(ptc: PTC, params: list[SubTensor]) -> dict:
    dtype = ptc.tensor_map[params[0].tensor].dtype
    state: dict[str, dict] = {}
    groups, masters = [], []
    for no_wd in (False, True):
        members = [st for st in params if _no_decay(ptc, st) == no_wd]
        if not members:
            continue
        ids = list(range(len(state), len(state) + len(members)))
        groups.append({"wd_mult": 0.0 if no_wd else 1.0, "lr_mult": 1.0, "lr": 0.0, "bias_correction": True,
                       "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.0 if no_wd else 0.01, "step": 0,
                       "params": ids})  # fmt: skip
        masters.append([{"tensor": list(st.shape)} for st in members])
        state.update(
            {str(i): {k: {"tensor": list(st.shape)} for k in ("exp_avg", "exp_avg_sq")} for i, st in zip(ids, members)}
        )
    inner = {"state": state, "param_groups": groups}
    if dtype == "float32":
        return inner
    scaler = {"grad_scaler": {"scale": {"tensor": [1]}, "growth_tracker": 0, "hysteresis_tracker": 2}}
    return {"optimizer": inner, **(scaler if dtype == "float16" else {}), "fp32_from_fp16_params": masters}
