"""An elastic job across emulated hosts (network namespaces, links shaped to 1 Gbit/s): one agent,
one torchrun node and one directory per host, the state moved peer to peer between the hosts'
stores. 2 hosts as tp 2 -> 3 hosts as dp 3 -> 2 hosts as pp 2, against a static run on this
machine: the same samples at every step and the same losses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenplex.elastic.cluster import Cluster
from tenplex.elastic.controller import Controller
from tenplex.elastic.job import parse_job
from tenplex.runtime.netns import EmulatedHosts, netns_unavailable_reason

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_gpt.py"
ARGS = ["--steps", "6", "--samples", "48", "--global-batch", "12", "--micro-batch", "2", "--layers", "2"]
REASON = netns_unavailable_reason()

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")]  # fmt: skip


def _metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(400)
def test_a_job_spans_hosts_and_moves_its_state_between_their_stores(tmp_path):
    base = {"program": str(EXAMPLE), "args": ARGS, "parallel": {"2": [2, 1, 1], "3": [1, 1, 3]}, "timeout": 300}
    Controller(parse_job({**base, "devices": 2}), tmp_path / "static", out=lambda _: None).run()
    job = parse_job({**base, "devices": 2, "gpus_per_host": 1,
                     "schedule": [{"at_step": 2, "devices": 3}, {"at_step": 4, "devices": 2, "pp": 2}]})  # fmt: skip
    lines: list[str] = []
    with EmulatedHosts(3, rate="1gbit") as hosts:
        cluster = Cluster.emulated(hosts, tmp_path / "elastic", per_node=1)
        recs = Controller(job, tmp_path / "elastic", out=lines.append, cluster=cluster).run()
    assert [(r.dst.tp, r.dst.pp, r.dst.dp) for r in recs] == [(1, 1, 3), (1, 2, 1)]
    assert all(r.bytes_moved > 0 and {"plan", "move"} <= set(r.phases) for r in recs)
    a, b = _metrics(tmp_path / "static"), _metrics(tmp_path / "elastic")
    assert [r["W"] for r in b] == [2, 2, 3, 3, 2, 2]
    assert [r["samples"] for r in a] == [r["samples"] for r in b]
    assert max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)) < 1e-4
    # each host worked in its own directory: host h2's holds only what its ranks wrote
    h2 = tmp_path / "elastic" / "hosts" / "h2"
    assert (h2 / "dataset-0").is_dir() and not (h2 / "state").exists()  # its state came from its store
    assert not (h2 / "metrics.jsonl").exists() and not list(h2.rglob(".metadata"))
