"""Shared pytest setup: hypothesis profiles `dev` (default) and `ci` (derandomized), chosen by
the HYPOTHESIS_PROFILE environment variable (`make test` sets `ci`); the `tenplex` CLI fixture."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=50)
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def tenplex():
    """`tenplex(*args)` runs the `tenplex` CLI in-process: (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from tenplex.cli.app import cli

    runner = CliRunner()

    def call(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(cli, list(args), catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    return call
