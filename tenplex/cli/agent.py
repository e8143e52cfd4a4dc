"""`tenplex agent`: run this host's agent (tensor store, UCX worker, optional REST API).

    tenplex agent --name NAME --control PATH|HOST:PORT [--token-file F] [--ucx-ip IP]
                  [--rest [HOST]:PORT [--rest-token-file F]] [--memory-budget SIZE [--spill-dir DIR]]

Tokens come from files or the environment, never from the command line (where `ps` shows
them): the control token from `--token-file` or `$TENPLEX_AGENT_TOKEN`, the REST token from
`--rest-token-file` or `$TENPLEX_REST_TOKEN`; the two must differ (docs/security.md).
"""

from __future__ import annotations

import click

from tenplex.cli.common import SIZE


def read_token(path: str | None, env: str, what: str) -> str | None:
    """The token in file `path` (stripped), else in `$env`, else None. Raises click errors naming the file."""
    import os
    from pathlib import Path

    if path is None:
        return os.environ.get(env) or None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{path}: cannot read the {what} ({getattr(e, 'strerror', None) or e})") from None
    if not token or "\n" in token:
        raise click.BadParameter(f"{path}: the {what} file must hold one non-empty line")
    return token


@click.command("agent")
@click.option("--name", required=True, help="The host name plans use for this agent.")
@click.option("--control", required=True, metavar="PATH|HOST:PORT",
              help="Where runtimes connect: a Unix socket path, or HOST:PORT (needs a token).")  # fmt: skip
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True),
              help="File holding the control token (default $TENPLEX_AGENT_TOKEN).")  # fmt: skip
@click.option("--ucx-ip", metavar="IP", help="Open a UCX TCP listener on IP for agents on other nodes.")
@click.option("--ucx-port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--rest", metavar="[HOST]:PORT", help="Also serve the store over the REST API here.")
@click.option("--rest-token-file", type=click.Path(dir_okay=False, exists=True),
              help="File holding the REST API's token (default $TENPLEX_REST_TOKEN); needed beyond loopback.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True,
              help="Seconds any UCX wait may take.")  # fmt: skip
@click.option("--memory-budget", type=SIZE, help="Most bytes the store keeps in memory (default 80% of RAM).")
@click.option("--spill-dir", type=click.Path(file_okay=False), help="Spill arrays here beyond the budget (else refuse them).")
@click.option("--local", "local", metavar="PATH", help="Serve the store to this machine's processes (training programs) "
              "on the Unix socket PATH, through shared memory.")  # fmt: skip
@click.option("--mount", "mount_dir", metavar="DIR", type=click.Path(file_okay=False),
              help="Also serve the store as files at DIR (FUSE, read-only): DIR/job/<job>/<tag>/...")  # fmt: skip
def agent_cmd(name: str, control: str, token_file: str | None, ucx_ip: str | None, ucx_port: int, rest: str | None,
              rest_token_file: str | None, timeout: float, memory_budget: int | None, spill_dir: str | None,
              local: str | None, mount_dir: str | None) -> None:  # fmt: skip
    """Run this host's agent (store + UCX worker [+ REST]) until SIGTERM or a runtime's stop."""
    from tenplex.runtime.agent.server import REST_TOKEN_ENV, TOKEN_ENV, run_agent

    token = read_token(token_file, TOKEN_ENV, "control token")
    rest_token = read_token(rest_token_file, REST_TOKEN_ENV, "REST token")
    budget = memory_budget if memory_budget is not None else default_budget()
    run_agent(name, control, token, ucx_ip, ucx_port, rest, timeout, rest_token, budget, spill_dir, local, mount_dir)


def default_budget() -> int | None:
    """80% of this machine's physical memory, or None where it cannot be read."""
    import os

    try:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
