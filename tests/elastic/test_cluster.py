"""Where a generation's ranks go on the hosts of a job, and the torchrun nodes seen as one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tenplex.elastic.cluster import Cluster, Node
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.launch import Nodes


def test_ranks_fill_hosts_in_order_and_rank_0_stays_on_the_first(tmp_path):
    nodes = tuple(Node(f"h{i}", f"10.0.0.{i}", tmp_path / f"h{i}") for i in range(3))
    cluster = Cluster(nodes, per_node=2)
    assert [(n.name, k) for n, k in cluster.place(5)] == [("h0", 2), ("h1", 2), ("h2", 1)]
    assert cluster.hosts_of_ranks(3) == {0: "h0", 1: "h0", 2: "h1"}
    with pytest.raises(ElasticError, match="7 processes do not fit 3 host"):
        cluster.place(7)
    local = Cluster.local(tmp_path)
    assert not local.multi and [(n.dir, k) for n, k in local.place(64)] == [(tmp_path, 64)]


def test_the_nodes_of_a_generation_fail_when_one_fails_and_end_together():
    fast_fail = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    nodes = Nodes([slow, fast_fail])
    fast_fail.wait(30)
    assert nodes.poll() == 3 and nodes.returncode is None  # failed, but one node still runs
    from tenplex.elastic.launch import terminate

    terminate(nodes, grace=5)
    assert nodes.returncode == 3 and slow.returncode is not None and Path(f"/proc/{slow.pid}").exists() is False
