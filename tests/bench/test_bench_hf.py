"""`python -m bench --only hf,dcp-zstd --quick` end to end: every row measured on both sides,
the bytes each side loaded are equal, and {hf,dcp-zstd}-quick.{md,json} are written."""

import json

import pytest

from bench.__main__ import main

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def test_quick_hf_and_zstd_benches_write_their_tables(tmp_path, capsys):
    for peer in ("torch", "safetensors", "zstandard"):
        pytest.importorskip(peer)
    assert main(["--only", "hf,dcp-zstd", "--quick", "--out", str(tmp_path)]) == 0
    hf = json.loads((tmp_path / "hf-quick.json").read_text())["rows"]
    zstd = json.loads((tmp_path / "dcp-zstd-quick.json").read_text())["rows"]
    assert [r["name"] for r in hf] == ["load a state dict", "open (memory-mapped)", "consolidate shards -> model.safetensors"]
    for r in hf + zstd:
        assert r["status"] == "ok" and r["equal"] is True, r
        assert len(r["anchor_s"]) == len(r["tenplex_s"]) == len(r["ratios"]) >= 3 and min(r["tenplex_s"]) > 0
    assert "anchor / tenplex (min/med/max)" in (tmp_path / "hf-quick.md").read_text()
    assert "ZStandard-compressed DCP" in capsys.readouterr().out
