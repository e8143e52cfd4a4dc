"""The CLI on model specs (the frontend's compact and JSON forms), and one real subprocess run
of `python -m tenplex.cli`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tenplex.compiler import plan_from_json
from tenplex.frontends.spec import ptc_from_spec

SRC, DST = "gpt-tiny:tp2,pp2@1x4", "gpt-tiny:tp4,pp1@1x4"
ROOT = Path(__file__).resolve().parents[2]


def test_compile_specs_states_the_allocation_it_realizes(tenplex):
    code, out, err = tenplex("compile", SRC, DST)
    assert code == 0
    plan = plan_from_json(json.loads(out))
    dst = ptc_from_spec(DST)
    moved = sorted(pid for pid, devs in dst.allocation.items if plan.allocation.devices_of(pid) != devs)
    assert moved, "place-ranks is expected to keep data in place by permuting tp ranks"
    assert f"place-ranks put {len(moved)} of 4 partitions on other devices than DST" in err
    text = tenplex("compile", SRC, DST, "--emit", "text")[1]
    assert f"rank placement: {len(moved)} of 4 partitions placed differently from dst" in text
    assert all(pid in text for pid in moved)


def test_no_place_ranks_keeps_the_dst_allocation(tenplex):
    code, out, err = tenplex("compile", SRC, DST, "--no-place-ranks")
    assert code == 0 and err == ""
    assert plan_from_json(json.loads(out)).allocation == ptc_from_spec(DST).allocation


def test_spec_files_and_ptc_files_give_the_same_plan(tenplex, tmp_path):
    src_ptc, dst_spec = tmp_path / "src.json", tmp_path / "dst_spec.json"
    assert tenplex("spec", SRC, "-o", str(src_ptc))[0] == 0
    dst_spec.write_text(
        json.dumps({"model": "gpt-tiny", "parallel": {"tp": 4, "pp": 1}, "cluster": {"hosts": 1, "gpus_per_host": 4}})
    )
    from_files = tenplex("compile", str(src_ptc), str(dst_spec))[1]
    assert from_files == tenplex("compile", SRC, DST)[1]


def test_verify_specs_executes_against_the_oracle(tenplex, tmp_path):
    plan = tmp_path / "plan.json"
    assert tenplex("compile", SRC, DST, "-o", str(plan))[0] == 0
    code, out, err = tenplex("verify", str(plan), SRC, DST)
    assert code == 0, err
    assert "execution: ok" in out and "plan verified: " in out


def test_spec_list(tenplex):
    code, out, _ = tenplex("spec", "--list")
    assert code == 0
    assert out.splitlines()[0].split() == ["preset", "kind", "layers", "hidden", "heads", "ffn", "vocab"]
    assert any(line.split()[:3] == ["gpt-tiny", "gpt", "4"] for line in out.splitlines())


def _run(*args: str, hash_seed: str = "0") -> subprocess.CompletedProcess:
    python = ROOT / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), "-m", "tenplex.cli", *args]
    env = os.environ | {"PYTHONHASHSEED": hash_seed}  # set iteration order must not leak into plans
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_subprocess_compile_is_deterministic_and_errors_exit_2(tmp_path):
    first, second = _run("compile", SRC, DST, hash_seed="1"), _run("compile", SRC, DST, hash_seed="2")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and json.loads(first.stdout)["format"] == "tenplex.plan/1"
    target = tmp_path / "plan.txt"
    bad = _run("compile", SRC, "gpt-tiny:tp3@1x4", "--emit", "text", "-o", str(target))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("tenplex: error: spec 'gpt-tiny:tp3@1x4'") and bad.stderr.count("\n") == 1
    assert not target.exists()


def test_huge_specs_are_one_line_errors_at_once(tenplex):
    """A spec longer than a file name can be is still a spec (it was 'File name too long');
    sizes past the limits fail before anything is built (they used to run for minutes)."""
    for spec, message in [
        ("gpt-tiny:tp" + "9" * 5000 + "@1x1", "tp=9999999999999999999999999999999999999... (5000 digits) exceeds the limit 1048576"),
        ("gpt-tiny@1000000x1000000", "devices (hosts*gpus_per_host)=1000000000000 exceeds the limit 1048576"),
        ("gpt-tiny:layers=100000000@1x1", "model num_layers=100000000 exceeds the limit 16384"),
    ]:
        code, out, err = tenplex("spec", spec)
        assert code == 2 and out == ""
        assert err.startswith("tenplex: error: spec ") and message in err and err.count("\n") == 1 and len(err) < 400
