"""Elastic jobs (docs/design.md §8): a controller that reacts to resource changes by choosing a
new parallel configuration, stopping the program at a step boundary, moving its saved state into
the new layout (between the agents' stores, or DCP files) and relaunching it; `Job` is what the
training program calls (`api`).

- the program's side: `api` (`Job`), `layouts` (`Parallelism`: the plan and pipeline split it
  declares, and the DTensor layout of a (tp, dp, pp)), `state` (where its state goes between
  generations), `jobdir` (the job directory);
- the controller's side: `controller` (generations and reconfigurations), `configs` (which
  layout), `launch` (torchrun), `job` (job files), `requests` and `http` (scale requests, status),
  `moves` (the state into the next layout), `failures` (after a failure), `cluster` (the hosts),
  `records` (what it measured), `recovery` (failure recovery plans), `parallelizer/`.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {"Job": "api", "ParallelConfig": "api", "Parallelism": "layouts"})
