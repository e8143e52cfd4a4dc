"""The `tenplex` command.

numpy is imported by `common.numpy_with_one_blas_thread` before a command's module (`app`), or
by the command itself where it has work to start before numpy (`tenplex reshard` starts OUT's
helper first: `cli.reshard`). Nothing here imports numpy.
"""

from tenplex.cli.app import cli, main

__all__ = ["cli", "main"]
