"""The dataset component's error: one subclass of `TenplexError`, so the CLI prints it on one
line and exits with code 2. Messages name the file, the sample or the field, and both values
when two disagree."""

from tenplex.ir.errors import TenplexError


class DataError(TenplexError, ValueError):
    """A dataset file, index, order, state or rank layout is malformed or does not match."""
