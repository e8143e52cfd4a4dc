"""The `tenplex` command: one click group, one module per command group.

    tenplex compile | verify          plans.py     plans from two PTCs or specs, and their proofs
    tenplex inspect | spec            specs.py     describe PTCs, specs and checkpoints
    tenplex reshard                   reshard.py   checkpoint directories in another layout
    tenplex layout                    layout.py    the DTensor layout of a DCP checkpoint (for reshard --to)
    tenplex agent                     agent.py     a host's agent
    tenplex store ls | mount          store.py     a saved state or checkpoint over FUSE
    tenplex dataset ...               dataset.py   sample indexes, orders, per-rank views
    tenplex job run | scale | status  job.py       elastic jobs

Options of the group: `--version`, `-q/--quiet` and `-v/--verbose` (the `tenplex` logger's level,
`common.configure_logging`).

Errors and exit codes (`common`, docs/cli.md): a usage error or a `TenplexError` (bad input)
prints one line `tenplex: error: <message>` on stderr and exits 2 (`EXIT_USAGE`); a
`PlanVerifyError` exits 3 (`EXIT_VERIFY`); any other exception is a bug: one line naming its type
and message, the traceback only with -v, exit 4 (`EXIT_INTERNAL`). Outputs are written
atomically, so an error leaves no file behind.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from typing import Any

import click

from tenplex.cli.common import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    EXIT_VERIFY,
    configure_logging,
    fail,
    is_verbose,
    numpy_with_one_blas_thread,
    teardown_skipped,
)
from tenplex.ir.errors import PlanVerifyError, TenplexError

# command name -> (module, attribute): a command's module (and what only it needs: the elastic
# controller, the dataset tools, ...) is imported when that command runs, or for --help; numpy
# first, with one BLAS thread, except for the modules that import it themselves later
COMMANDS = {
    "compile": ("tenplex.cli.plans", "compile_cmd"), "verify": ("tenplex.cli.plans", "verify"),
    "inspect": ("tenplex.cli.specs", "inspect_cmd"), "spec": ("tenplex.cli.specs", "spec"),
    "reshard": ("tenplex.cli.reshard", "reshard_cmd"), "layout": ("tenplex.cli.layout", "layout_cmd"),
    "agent": ("tenplex.cli.agent", "agent_cmd"), "dataset": ("tenplex.cli.dataset", "dataset"),
    "job": ("tenplex.cli.job", "job"), "store": ("tenplex.cli.store", "store"),
}  # fmt: skip
NUMPY_LATER = {"tenplex.cli.reshard"}  # starts OUT's preallocation helper before it imports numpy

EPILOG = f"""\b
Exit codes:
  0    success
  {EXIT_USAGE}    usage error or bad input (a file, spec or checkpoint tenplex cannot use)
  {EXIT_VERIFY}    a plan or checkpoint failed verification
  {EXIT_INTERNAL}    internal error: a bug in tenplex (run with -v for the traceback)
  130  interrupted (Ctrl-C); 128+N: ended by signal N
Errors are one line on stderr: tenplex: error: <message>. Details: docs/cli.md."""


class _Tenplex(click.Group):
    """Runs click in non-standalone mode so that every failure ends in one error line; loads
    each command from `COMMANDS` when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        if module not in NUMPY_LATER:
            numpy_with_one_blas_thread()
        return getattr(importlib.import_module(module), attr)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
            fail(e.format_message() + hint)
        except click.ClickException as e:
            fail(e.format_message())
        except click.Abort:
            fail("aborted", 130)
        except PlanVerifyError as e:
            fail(str(e), EXIT_VERIFY)
        except TenplexError as e:
            fail(str(e), EXIT_USAGE)
        except OSError as e:
            fail(f"{e.filename or 'I/O'}: {e.strerror or e}", EXIT_USAGE)
        except Exception as e:  # noqa: BLE001 (anything else is a bug: one line, the traceback with -v)
            _internal(e)
        sys.exit(code if isinstance(code, int) else 0)


def _internal(e: Exception) -> None:
    if is_verbose():
        click.echo("".join(traceback.format_exception(e)).rstrip(), err=True)
    hint = "" if is_verbose() else "; run with -v for the traceback"
    fail(f"internal error: {type(e).__name__}: {e} (this is a bug: please report it{hint})", EXIT_INTERNAL)


def _version(ctx: click.Context, _param: object, value: bool) -> None:
    """`--version`: `tenplex X.Y.Z` (the version is looked up only here: importlib.metadata is slow to import)."""
    if value and not ctx.resilient_parsing:
        from tenplex import __version__

        click.echo(f"tenplex {__version__}")
        ctx.exit()


@click.group(name="tenplex", cls=_Tenplex, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")  # fmt: skip
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Debug messages on stderr, and tracebacks of internal errors.")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """Reconfigure the state of multi-dimensional parallel deep-learning jobs with verified,
    minimal plans. SRC/DST are PTC JSON files or model specs such as gpt-1.3b:tp2,pp2,dp2@4x4."""
    if quiet and verbose:
        raise click.UsageError("give -q or -v, not both")
    ctx.call_on_close(configure_logging(1 if verbose else -1 if quiet else 0))


def main(argv: list[str] | None = None) -> None:
    """The console-script entry point. SIGTERM becomes an exit (status 143) that unwinds like
    Ctrl-C does, so outputs being written are removed, never left half-written; commands that
    serve until SIGTERM (mounts, agents, jobs) install their own handlers. A command that
    succeeded after `common.skip_teardown()` ends with `os._exit` once stdout and stderr are
    flushed: the interpreter's teardown (freeing every module and object, ~30-40 ms after a
    reshard, more under load) does nothing such a process needs."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        cli.main(args=argv, prog_name="tenplex")
    except SystemExit as e:
        if e.code in (0, None) and teardown_skipped():
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except OSError:  # a closed pipe: the ordinary exit reports it
                raise e from None
            os._exit(0)
        raise


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
