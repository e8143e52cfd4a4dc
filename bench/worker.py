"""`python -m bench.worker compile|bytes SRC DST`: one measurement in this fresh process,
printed as one JSON line on stdout. `compile` pins the process to one core first."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    kind, src, dst = argv
    if kind == "compile" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from bench.measure import measure_bytes, measure_compile  # after pinning: imports count too

    result = (measure_compile if kind == "compile" else measure_bytes)(src, dst)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
