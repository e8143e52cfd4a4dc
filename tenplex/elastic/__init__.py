"""Elastic jobs (docs/design.md §8): a controller that reacts to resource changes by choosing a
new parallel configuration, stopping the program at a step boundary, resharding its saved state
and relaunching it; `Job` is what the training program calls (`api`).

- the program's side: `api` (`Job`), `layouts` (its DTensor layout for a (tp, dp, pp)), `jobdir`
  (the job directory);
- the controller's side: `controller` (generations and reconfigurations), `configs` (which
  layout), `launch` (torchrun), `job` (job files), `requests` and `http` (scale requests, status),
  `records` (what it measured), `recovery` (failure recovery plans), `parallelizer/`.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {"Job": "api", "ParallelConfig": "api"})
