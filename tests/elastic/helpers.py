"""Shared by the end-to-end elastic tests: the example program, job documents, metrics."""

import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_gpt.py"
ARGS = ["--samples", "64", "--layers", "1"]
STATIC_STEPS = 5


def metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def job_doc(steps: int = STATIC_STEPS, **fields) -> dict:
    return {"program": str(EXAMPLE), "args": ["--steps", str(steps), *ARGS], "devices": 2, "timeout": 120, **fields}


def same_training(static: list[dict], run: list[dict]) -> None:
    """The last time each of the static run's steps ran in `run` matches it: losses and sample ids."""
    last = {r["step"]: r for r in run}
    for x in static:
        y = last[x["step"]]
        assert y["samples"] == x["samples"]
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4), (x["step"], x["loss"], y["loss"])
