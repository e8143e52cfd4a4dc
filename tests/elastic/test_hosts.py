"""An elastic job across emulated hosts (network namespaces, links shaped to 1 Gbit/s): one agent,
one torchrun node and one directory per host, the state moved peer to peer between the hosts'
stores. 2 hosts as tp 2 -> 3 hosts as dp 3 -> 2 hosts as pp 2, against a static run on this
machine: the same samples at every step and the same losses."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tenplex.elastic.cluster import Cluster
from tenplex.elastic.controller import Controller
from tenplex.elastic.job import parse_job
from tenplex.runtime.netns import EmulatedHosts, netns_unavailable_reason
from tests.elastic.helpers import same_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_gpt.py"
ARGS = ["--steps", "6", "--samples", "48", "--global-batch", "12", "--micro-batch", "2", "--layers", "2"]
REASON = netns_unavailable_reason()

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")]  # fmt: skip


def _metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(400)
def test_a_job_spans_hosts_and_moves_its_state_between_their_stores(tmp_path, static_metrics):
    base = {"program": str(EXAMPLE), "args": ARGS, "parallel": {"2": [2, 1, 1], "3": [1, 1, 3]}, "timeout": 300}
    job = parse_job({**base, "devices": 2, "gpus_per_host": 1,
                     "schedule": [{"at_step": 2, "devices": 3}, {"at_step": 4, "devices": 2, "pp": 2}]})  # fmt: skip
    lines: list[str] = []
    with EmulatedHosts(3, rate="1gbit") as hosts:
        cluster = Cluster.emulated(hosts, tmp_path / "elastic", per_node=1)
        recs = Controller(job, tmp_path / "elastic", out=lines.append, cluster=cluster).run()
    assert [(r.dst.tp, r.dst.pp, r.dst.dp) for r in recs] == [(1, 1, 3), (1, 2, 1)]
    assert all(r.bytes_moved > 0 and {"plan", "move"} <= set(r.phases) for r in recs)
    a, b = static_metrics({**base, "devices": 2}), _metrics(tmp_path / "elastic")
    assert [r["W"] for r in b] == [2, 2, 3, 3, 2, 2]
    assert [r["samples"] for r in a] == [r["samples"] for r in b]
    assert max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)) < 1e-4
    # each host worked in its own directory: host h2's holds only what its ranks wrote
    h2 = tmp_path / "elastic" / "hosts" / "h2"
    assert (h2 / "dataset-0").is_dir() and not (h2 / "state").exists()  # its state came from its store
    assert not (h2 / "metrics.jsonl").exists() and not list(h2.rglob(".metadata"))


@pytest.mark.timeout(400)
def test_a_lost_host_is_detected_and_the_job_goes_on_from_the_survivors_stores(tmp_path, static_metrics):
    base = {"program": str(EXAMPLE), "args": ARGS, "parallel": {"2": [2, 1, 1], "3": [1, 1, 3]}, "timeout": 300}
    job = parse_job({**base, "devices": 2, "gpus_per_host": 1, "schedule": [{"at_step": 2, "devices": 3}]})
    lines: list[str] = []
    killed, recs = _run_losing_a_host(job, tmp_path / "elastic", lines, 2, lambda r: r["W"] == 3 and r["step"] == 3)
    assert killed >= 2  # its agent and its rank, at an arbitrary moment
    [first, lost] = recs
    assert (lost.src.world, lost.dst.world, lost.failed, lost.recovered_from) == (3, 2, (2,), "checkpoint")
    assert any("host(s) h2 lost with rank(s) [2]" in line for line in lines)
    run = _metrics(tmp_path / "elastic")
    assert run[-1]["step"] == 5 and run[-1]["W"] == 2
    same_training(static_metrics({**base, "devices": 2}), run)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("replicas", [0, 1])
def test_a_lost_host_holding_the_only_shards_needs_store_replicas_else_the_job_restarts(tmp_path, replicas, static_metrics):
    """dp 3 on 3 hosts, then tp 2 on h0, h1; h1 is lost. Without store replicas its shards are gone:
    the job restarts from its start and says so; with one, h2 holds a copy of h1's start state and
    the job goes on (on h0 and h2) from the generation's start, losing only its steps."""
    base = {"program": str(EXAMPLE), "args": ARGS, "parallel": {"2": [2, 1, 1], "3": [1, 1, 3]}, "timeout": 300}
    job = parse_job({**base, "devices": 3, "gpus_per_host": 1, "store_replicas": replicas,
                     "schedule": [{"at_step": 2, "devices": 2}]})  # fmt: skip
    lines: list[str] = []  # host h1 holds half of every tp-split tensor
    _, recs = _run_losing_a_host(job, tmp_path / "elastic", lines, 1, lambda r: r["tp"] == 2 and r["step"] == 3)
    lost = recs[-1]
    restarted = any("the survivors do not hold the whole state" in line and "from its start" in line for line in lines)
    run = _metrics(tmp_path / "elastic")
    if replicas:
        assert (lost.failed, lost.lost_steps, lost.dst.world, restarted) == ((1,), 2, 2, False)
        assert [r["step"] for r in run][-4:] == [2, 3, 4, 5] and run[-1]["tp"] == 2  # on h0 and h2
        same_training(static_metrics({**base, "devices": 2}), run)
    else:
        assert (lost.failed, lost.lost_steps, lost.dst.world, restarted) == ((1,), 4, 2, True)
        assert [r["step"] for r in run][-6:] == list(range(6))  # every step again, from the start


def _run_losing_a_host(job, job_dir: Path, lines: list[str], host: int, when) -> tuple[int, list]:
    """Run `job` on 3 emulated hosts and kill every process of `host` once rank 0 logged a step
    record for which `when(record)` holds: (processes killed, the reconfigurations)."""
    with EmulatedHosts(3, rate="1gbit") as hosts:
        controller = Controller(job, job_dir, out=lines.append, cluster=Cluster.emulated(hosts, job_dir))
        done: list = []
        thread = threading.Thread(target=lambda: done.append(controller.run()), daemon=True)
        thread.start()
        while not ((job_dir / "metrics.jsonl").exists() and any(map(when, _metrics(job_dir)))):
            assert thread.is_alive(), "the job ended before the moment to lose the host"
            thread.join(0.1)
        killed = hosts.kill(host)
        thread.join(300)
    assert done, "the job did not finish after the host was lost"
    return killed, done[0]
