"""Shared pytest setup: hypothesis profiles `dev` (default) and `ci` (derandomized), chosen by
the HYPOTHESIS_PROFILE environment variable (`make test` sets `ci`); the `tenplex` CLI fixture;
files with slow tests run first."""

import os
from collections import Counter

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with more `slow` tests first, each file's tests together and in their order: on
    `-n` workers the long tests start early and spread over the workers instead of ending the
    run on one of them."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])
