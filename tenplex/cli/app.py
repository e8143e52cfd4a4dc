"""The `tenplex` command: one click group, one module per command group.

    tenplex compile | verify          plans.py     plans from two PTCs or specs, and their proofs
    tenplex inspect | spec            specs.py     describe PTCs, specs and checkpoints
    tenplex reshard                   reshard.py   checkpoint directories in another layout
    tenplex agent                     agent.py     a host's agent
    tenplex store ls | mount          store.py     a saved state or checkpoint over FUSE
    tenplex dataset ...               dataset.py   sample indexes, orders, per-rank views
    tenplex job run | scale | status  job.py       elastic jobs

Errors (`common`): one line `tenplex: error: <message>` on stderr, exit code 2; outputs are
written atomically, so an error leaves no file behind.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from tenplex.cli.agent import agent_cmd
from tenplex.cli.common import fail
from tenplex.cli.dataset import dataset
from tenplex.cli.job import job
from tenplex.cli.plans import compile_cmd, verify
from tenplex.cli.reshard import reshard_cmd
from tenplex.cli.specs import inspect_cmd, spec
from tenplex.cli.store import store
from tenplex.ir.errors import TenplexError


class _Tenplex(click.Group):
    """Runs click in non-standalone mode so that every failure ends in one error line."""

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
        except TenplexError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{e.filename or 'I/O'}: {e.strerror or e}")
        sys.exit(code if isinstance(code, int) else 0)


@click.group(name="tenplex", cls=_Tenplex, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Reconfigure the state of multi-dimensional parallel deep-learning jobs with verified,
    minimal plans. SRC/DST are PTC JSON files or model specs such as gpt-1.3b:tp2,pp2,dp2@4x4."""


cli.add_command(compile_cmd)
cli.add_command(verify)
cli.add_command(inspect_cmd)
cli.add_command(spec)
cli.add_command(reshard_cmd)
cli.add_command(agent_cmd)
cli.add_command(dataset)
cli.add_command(job)
cli.add_command(store)


def main(argv: list[str] | None = None) -> None:
    """The console-script entry point. SIGTERM becomes an exit (status 143) that unwinds like
    Ctrl-C does, so outputs being written are removed, never left half-written; commands that
    serve until SIGTERM (mounts, agents, jobs) install their own handlers."""
    signal.signal(signal.SIGTERM, _terminated)
    cli.main(args=argv, prog_name="tenplex")


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
