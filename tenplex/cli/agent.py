"""`tenplex agent`: run this host's agent (tensor store, UCX worker, optional REST API).

    tenplex agent --name NAME --control PATH|HOST:PORT [--token-file F] [--ucx-ip IP] [--rest [HOST]:PORT]
"""

from __future__ import annotations

import click


@click.command("agent")
@click.option("--name", required=True, help="The host name plans use for this agent.")
@click.option("--control", required=True, metavar="PATH|HOST:PORT",
              help="Where runtimes connect: a Unix socket path, or HOST:PORT (needs a token).")  # fmt: skip
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True),
              help="File holding the shared token (default $TENPLEX_AGENT_TOKEN).")  # fmt: skip
@click.option("--ucx-ip", metavar="IP", help="Open a UCX TCP listener on IP for agents on other nodes.")
@click.option("--ucx-port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--rest", metavar="[HOST]:PORT", help="Also serve the store over the REST API here.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds any UCX wait may take.")
def agent_cmd(name: str, control: str, token_file: str | None, ucx_ip: str | None, ucx_port: int,
              rest: str | None, timeout: float) -> None:  # fmt: skip
    """Run this host's agent (store + UCX worker [+ REST]) until SIGTERM or a runtime's stop."""
    import os
    from pathlib import Path

    from tenplex.runtime.agent.server import TOKEN_ENV, run_agent

    token = Path(token_file).read_text().strip() if token_file else os.environ.get(TOKEN_ENV)
    run_agent(name, control, token, ucx_ip, ucx_port, rest, timeout)
