"""Benchmarks for issue #2's figures: `python -m bench [--quick] [--only compile|bytes]`.

- `compile`: compile + verify time and peak memory of large reconfigurations, one fresh
  process per case pinned to one core (`bench.measure.measure_compile`).
- `bytes`: network bytes of the plan vs the network lower bound vs the reference Tenplex's
  source choice, for the paper's reconfigurations (`bench.measure.measure_bytes`).

Results go to stdout and `bench/results/compiler{,-quick}.{json,md}`.
"""
