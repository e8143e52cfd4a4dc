"""The elastic layer's errors: `TenplexError` subclasses, so the CLI prints them on one line and
exits with code 2. Messages name the file, the field and the value."""

from tenplex.ir.errors import TenplexError


class ElasticError(TenplexError, ValueError):
    """A job file, job directory, parallel configuration or training program run is wrong."""


class JobFileError(ElasticError):
    """A job file is malformed; the message names the file and the field."""


class ProgramFailed(ElasticError):
    """A generation's program exited non-zero (not an injected failure); `exited`: when."""

    def __init__(self, exited: float, message: str) -> None:
        super().__init__(message)
        self.exited = exited
