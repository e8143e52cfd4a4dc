"""The `tenplex` command.

numpy is first imported here with one OpenBLAS thread: its OpenBLAS starts a server thread per
further core when it loads, and each spins for ~0.1 s waiting for work that no tenplex command
gives it in its own process (no BLAS here), ~60 ms CPU of the core that a reshard's writers
and helper need (`import numpy`: 0.16-0.18 CPU s, 0.10-0.12 with one thread). The variable is
set only while numpy loads, and only where the user did not set it, so processes started from
here (agents, workers, jobs) get the environment they were given.
"""

import os
import sys


def _numpy_with_one_blas_thread() -> None:
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


_numpy_with_one_blas_thread()

from tenplex.cli.app import cli, main  # noqa: E402

__all__ = ["cli", "main"]
