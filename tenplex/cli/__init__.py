"""The `tenplex` command."""

from tenplex.cli.app import cli, main

__all__ = ["cli", "main"]
