"""`tenplex inspect` and `describe`: the partition table, totals, and notes in plain words."""

from __future__ import annotations

import re

from tenplex.compiler.emit.describe import describe
from tenplex.ir.serialize import ptc_from_json
from tests.cli.conftest import dst_doc, padded, ptc_doc, rows, src_doc, write


def test_partition_table_and_totals(tenplex, files):
    code, out, err = tenplex("inspect", files["dst"])
    assert code == 0, err
    for k in range(4):
        assert re.search(rf"^  tp{k} +{k} +h{k // 2} +2 +48 B +iteration$", out, re.M)
    assert "tensors:     2 (184 B logical, each element once)" in out
    assert re.search(r"float16 +1 +56 B +56", out) and re.search(r"float32 +1 +128 B +128", out)
    assert "held:        192 B on devices" in out
    assert "hosts:       2 (h0, h1)" in out


def test_notes_name_padding_and_idle_devices():
    out = describe(ptc_from_json(dst_doc()))
    assert "padding: 1 sub-tensor(s) hold 8 B of fill" in out and "emb/tp3" in out
    out = describe(ptc_from_json(src_doc()))
    assert "idle: 2 device(s) hold no partition: 2, 3" in out


def test_notes_name_gaps_and_replicas(tmp_path, tenplex):
    doc = ptc_doc({"tp0": ([0, 2, 3], {"w/tp0": rows("w", 0, 4), "emb/tp0": padded("emb", 0, 7, 8)})})
    code, out, _ = tenplex("inspect", write(tmp_path / "partial.json", doc))
    assert code == 0
    assert "incomplete: tensor 'w' has 1 region(s) held by no sub-tensor, 64 B in all, first" in out
    assert (
        "replicated: 1 partition(s) are held on several devices (data-parallel replicas), 256 B beyond one copy: tp0 x3"
        in out
    )


def test_complete_ptc_without_notes(tmp_path, tenplex):
    doc = ptc_doc({"tp0": ([0], {"w/tp0": rows("w", 0, 8), "emb/tp0": rows("emb", 0, 7)})})
    doc["devices"] = doc["devices"][:1]
    out = tenplex("inspect", write(tmp_path / "one.json", doc))[1]
    assert "none: the PTC is complete, without fill or replicas" in out


def test_inspect_a_spec(tenplex):
    code, out, err = tenplex("inspect", "gpt-tiny:tp2,pp2,dp2@2x4")
    assert code == 0, err
    assert re.search(r"^  pp1-tp1 +5,7 +h1 ", out, re.M)
    assert "replicated: 4 partition(s)" in out and "padding:" in out
