"""`python -m bench --only dataset --quick` end to end: every read path measured (the FUSE view
read by a child process), all paths deliver the same (id, bytes) sequence, the rescale table
has its four scenarios, and dataset-quick.{md,json} are written."""

import json
import os

import pytest

from bench.__main__ import main
from tenplex.runtime.fuse.dataset import fuse_unavailable_reason

REASON = fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mounting FUSE in tests needs root")
pytestmark = [
    pytest.mark.fuse,
    pytest.mark.slow,
    pytest.mark.multiprocess,
    pytest.mark.skipif(REASON is not None, reason=f"FUSE unavailable: {REASON}"),
]


def test_quick_dataset_bench_writes_its_tables(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["--only", "dataset", "--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dataset-quick.json").read_text())
    reads, rescale = doc["reads"], doc["rescale"]["rows"]
    assert [r["method"] for r in reads] == [
        "direct",
        "ring",
        "ring2",
        "batches0",
        "batches2",
        "loader2",
        "bound",
        "files",
        "fuse",
        "stepfiles",
        "fusestep",
        "rangesfiles",
        "fuseranges",
    ]
    assert all(len(r["ratios"]) == 1 for r in reads) and reads[0]["ratios"] == [1.0]
    assert all(r["status"] == "ok" and r["best_mbps"] > 0 for r in reads), reads
    assert len({d for r in reads for d in r["digests"]}) == 1  # one (id, bytes) sequence for every path
    direct, bound = reads[0], reads[6]  # the bound: direct's seconds plus two measured round trips per file
    assert 0 < bound["rtt_us"][0] < 1e4 and bound["ratios"][0] < 1.0
    assert bound["seconds"][0] == pytest.approx(2 * bound["rtt_us"][0] * 1e-6 * direct["samples"])
    assert reads[4]["goal"] in ("met", "MISSED") and reads[10]["goal"] in ("met", "MISSED") and reads[12]["goal"] in ("met", "MISSED")
    assert bound["goal"] == reads[1]["goal"] == reads[7]["goal"] == reads[9]["goal"] == reads[11]["goal"] == "—"
    assert [r["scenario"] for r in rescale] == ["none", "storage", "peers", "kept"]
    assert rescale[2]["storage_bytes"] == 0 and rescale[2]["peer_bytes"] == rescale[0]["storage_bytes"]
    md = (tmp_path / "dataset-quick.md").read_text()
    assert md.count("\n| ") == len(reads) + 1 + len(rescale) + 1 and "First batch after a rescale" in md
    assert "Process round trip (the bound rows): " in md and "load average" in md
    out = capsys.readouterr().out
    assert "FUSE view (child process)" in out and "FUSE view, a file per step" in out and "ranges + sources" in out
