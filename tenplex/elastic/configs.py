"""The parallel configuration of a generation: event hint, parallelizer, table, or DP only.

`choose_config(spec, devices, tp=None)` decides, in this order:
1. `tp` or `pp` given (a schedule event's hint): (tp or 1, pp or 1, dp = devices / (tp pp));
2. the job has a `model` and `tenplex.elastic.parallelizer` is importable: its `choose` (with
   the job's `parallel` table), pipeline stages included;
3. the job's `parallel` table entry for `devices`;
4. data parallelism only: (tp 1, pp 1, dp = devices).

Raises the parallelizer's SpecErrors (a model that fits nowhere, a bad table entry), naming the
devices.
"""

from __future__ import annotations

import importlib

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.job import JobSpec


def _parallelizer():
    try:
        return importlib.import_module("tenplex.elastic.parallelizer")
    except ImportError:
        return None


def _from_parallelizer(module, spec: JobSpec, devices: int) -> ParallelConfig:
    from tenplex.frontends.presets import model_from_fields

    model = model_from_fields(spec.model or {}, f"{spec.source}: job.model")
    choice = module.choose(devices, model, spec.gpus_per_host, table=spec.table)
    return ParallelConfig(choice.tp, choice.dp, choice.pp)


def choose_config(spec: JobSpec, devices: int, tp: int | None = None, pp: int | None = None) -> ParallelConfig:
    """The (tp, dp, pp) of a generation on `devices` processes (see the module docstring)."""
    if tp is not None or pp is not None:
        tp, pp = tp or 1, pp or 1
        return ParallelConfig(tp, devices // (tp * pp), pp)
    module = _parallelizer()
    if spec.model is not None and module is not None:
        return _from_parallelizer(module, spec, devices)
    entry = (spec.table or {}).get(devices)
    if entry is not None:
        e_tp, e_pp, e_dp = entry
        return ParallelConfig(e_tp, e_dp, e_pp)
    return ParallelConfig(1, devices)
