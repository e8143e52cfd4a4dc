"""The one exception hierarchy of tenplex.

Every error a user can cause derives from `TenplexError`; the CLI prints its message on one
line and exits with code 2, or 3 for a `PlanVerifyError` (a plan or checkpoint that fails
verification; see `tenplex/cli/common.py`). Messages quote the offending values and name the
file or field.
"""


class TenplexError(Exception):
    """Base of every error tenplex raises on purpose."""


class IRError(TenplexError, ValueError):
    """An IR value would violate one of its invariants."""


class ParseError(TenplexError, ValueError):
    """A document (PTC JSON, plan JSON, model spec) is malformed; the message names the field."""


class SpecError(TenplexError, ValueError):
    """A model spec or parallel configuration is invalid or does not fit the devices."""


class CompileError(TenplexError):
    """The compiler cannot build a plan (e.g. src lacks a region that dst needs)."""


class PlanVerifyError(TenplexError):
    """A plan does not realize dst from src; names tensor, device and boxes."""


class ExecutionError(TenplexError):
    """Executing a plan failed; names the host and the op."""
