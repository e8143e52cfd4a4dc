"""The static run the end-to-end elastic tests compare against (once per session)."""

import pytest

from tests.elastic.helpers import job_doc, metrics


@pytest.fixture(scope="session")
def static_run(tmp_path_factory) -> list[dict]:
    """The metrics of STATIC_STEPS steps on 2 processes (tp 1, dp 2) without any change."""
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.job import parse_job

    out = tmp_path_factory.mktemp("static")
    assert Controller(parse_job(job_doc()), out, out=lambda _: None).run() == []
    return metrics(out)
