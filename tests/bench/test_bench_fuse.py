"""`python -m bench --only fuse --quick` end to end: every row measured (children read the mounts
served by this process: the read-only one by `fuse.session`, the others by libfuse), the tuned
mount's read-ahead reported, fuse-quick.{md,json} written."""

import json
import os

import pytest

from bench.__main__ import main
from tenplex.runtime.fuse.store import READ_AHEAD_KB, fuse_unavailable_reason

REASON = fuse_unavailable_reason() or (None if os.geteuid() == 0 else "mounting FUSE in tests needs root")
pytestmark = [
    pytest.mark.fuse,
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"FUSE unavailable: {REASON}"),
]


def test_quick_fuse_bench_writes_its_tables(tmp_path, capsys):
    assert main(["--only", "fuse", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fuse-quick.json").read_text())["fuse"]
    assert [r["status"] for r in rows] == ["ok"] * len(rows) and len(rows) == 24, rows
    assert all(min(r["gbps"]) > 0 and min(r["cpu_s"]) > 0 and r["bytes"] == 32 << 20 for r in rows)
    fuse = [r for r in rows if r["source"].startswith("FUSE")]
    libfuse = [r for r in fuse if "libfuse, " in r["source"]]
    assert len(fuse) == 13 and len(libfuse) == 6
    assert all(f"(read-ahead {READ_AHEAD_KB} KiB)" in r["source"] for r in libfuse)
    assert all(r["source"].endswith("(kernel protocol)") for r in fuse if r not in libfuse)  # root: fuse.session
    assert all(len(r["ratios"]) == len(r["cpu_ratios"]) == 1 for r in fuse)  # each against its tmpfs anchor
    md = (tmp_path / "fuse-quick.md").read_text()
    assert md.count("\n| ") == len(rows) + 1 and "load_npy" in md and "odirect 16 MiB" in md
    bound = next(r for r in rows if r["method"] == "copy2 1 MiB")  # the two-copy anchor, against tmpfs read 1 MiB
    assert bound["source"] == "bound: two copies (tmpfs)" and len(bound["ratios"]) == 1
    assert "keep_cache re-read" in capsys.readouterr().out
