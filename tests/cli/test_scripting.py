"""The `tenplex` command in scripts (issue 13 items 8 and 14): `--version` and `__version__`,
`-q`/`-v` through the `tenplex` logger, one exit code per kind of failure (the table in
docs/cli.md and `tenplex --help`), `--json` documents of `inspect` and `store ls`, and what a
missing path argument says."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import tenplex
from tenplex.cli.common import EXIT_INTERNAL, EXIT_USAGE, EXIT_VERIFY, configure_logging
from tenplex.ir.errors import PlanVerifyError
from tenplex.runtime.checkpoint import save
from tests.cli.conftest import dst_doc, write

ROOT = Path(__file__).resolve().parents[2]


# ---- version --------------------------------------------------------------------------------
def test_version_is_the_package_version(tenplex):
    code, out, err = tenplex("--version")
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (code, out, err) == (0, f"tenplex {want}\n", "") and tenplex_version() == want


def tenplex_version() -> str:
    return tenplex.__version__


def test_version_of_a_source_checkout_comes_from_pyproject(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert tenplex._version() == want


# ---- logging: -q / -v -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, shown",
    [((), True), (("-q",), False), (("--quiet",), False), (("-v",), True)],
    ids=["default", "-q", "--quiet", "-v"],
)
def test_quiet_hides_what_was_written(tmp_path, tenplex, flags, shown):
    out_file = tmp_path / "ptc.json"
    code, out, err = tenplex(*flags, "spec", "gpt-tiny:tp2@1x2", "-o", str(out_file))
    assert code == 0 and out == "" and out_file.is_file(), err
    assert err.startswith(f"tenplex: wrote {out_file} (") == shown and (err == "") == (not shown), err


def test_quiet_and_verbose_together_is_a_usage_error(tenplex):
    code, out, err = tenplex("-q", "-v", "spec", "--list")
    assert code == EXIT_USAGE and out == "" and err.startswith("tenplex: error: give -q or -v, not both")


def _records(capsys, verbosity: int, emit) -> str:
    restore = configure_logging(verbosity)
    try:
        emit()
    finally:
        restore()
    return capsys.readouterr().err


def test_log_records_go_to_stderr_with_the_prefix_at_the_chosen_level(capsys):
    agent = logging.getLogger("tenplex.agent")

    def emit():
        agent.debug("agent h0: debug")
        agent.info("agent h0: info")
        agent.warning("agent h0: rejected a connection: %s", "bad token")

    assert _records(capsys, 0, emit) == "tenplex: agent h0: info\ntenplex: agent h0: rejected a connection: bad token\n"
    assert _records(capsys, -1, emit) == "tenplex: agent h0: rejected a connection: bad token\n"
    assert _records(capsys, 1, emit).startswith("tenplex: agent h0: debug\n")
    assert not [h for h in logging.getLogger("tenplex").handlers if type(h).__name__ == "_Stderr"]  # restored


def test_progress_shows_off_a_terminal_only_with_verbose(capsys):
    def emit():
        logging.getLogger("tenplex.elastic").info("generation 0: starting")
        logging.getLogger("tenplex").info("a step", extra={"progress": True})
        logging.getLogger("tenplex.elastic").warning("generation 0: slow")

    assert _records(capsys, 0, emit) == "tenplex: generation 0: slow\n"  # capsys: not a terminal
    assert _records(capsys, 1, emit) == "tenplex: generation 0: starting\ntenplex: a step\ntenplex: generation 0: slow\n"


# ---- exit codes -------------------------------------------------------------------------------
def _raise(exc: Exception):
    def describe(ptc):
        raise exc

    return describe


@pytest.mark.parametrize(
    "args, exc, code, message",
    [
        (("inspect", "--no-such-option", "x"), None, EXIT_USAGE, "No such option '--no-such-option'"),
        (("inspect", "missing.json"), None, EXIT_USAGE, "missing.json: cannot read: No such file or directory"),
        (("inspect", "gpt-tiny:tp2@1x2"), PlanVerifyError("dst element [0, 0] of 'w' is written twice"), EXIT_VERIFY,
         "dst element [0, 0] of 'w' is written twice"),
        (("inspect", "gpt-tiny:tp2@1x2"), ZeroDivisionError("division by zero"), EXIT_INTERNAL,
         "internal error: ZeroDivisionError: division by zero (this is a bug: please report it; run with -v for the traceback)"),
    ],
    ids=["usage", "bad-input", "verify", "internal"],
)  # fmt: skip
def test_each_kind_of_failure_has_its_exit_code(tenplex, monkeypatch, args, exc, code, message):
    if exc is not None:
        monkeypatch.setattr("tenplex.compiler.emit.describe.describe", _raise(exc))
    got, out, err = tenplex(*args)
    assert got == code and out == "" and err.count("\n") == 1, err
    assert err.startswith("tenplex: error: ") and message in err


def test_an_internal_error_shows_its_traceback_with_verbose(tenplex, monkeypatch):
    monkeypatch.setattr("tenplex.compiler.emit.describe.describe", _raise(ZeroDivisionError("division by zero")))
    code, out, err = tenplex("-v", "inspect", "gpt-tiny:tp2@1x2")
    assert code == EXIT_INTERNAL and out == ""
    assert err.startswith("Traceback (most recent call last):") and "ZeroDivisionError: division by zero" in err
    assert err.splitlines()[-1] == ("tenplex: error: internal error: ZeroDivisionError: division by zero "
                                    "(this is a bug: please report it)")  # fmt: skip


def test_help_lists_the_exit_codes(tenplex):
    code, out, _ = tenplex("--help")
    assert code == 0
    for line in ("Exit codes:", "0    success", "2    usage error or bad input", "3    a plan or checkpoint failed",
                 "4    internal error: a bug in tenplex", "130  interrupted"):  # fmt: skip
        assert line in out, line
    assert "--version" in out and "-q, --quiet" in out and "-v, --verbose" in out


def test_exit_codes_of_the_console_script():
    """The installed entry point (not click's test runner) exits with the same codes."""
    run = [sys.executable, "-m", "tenplex.cli"]
    assert subprocess.run([*run, "inspect", "nonexistent_dir"], capture_output=True, timeout=60).returncode == EXIT_USAGE
    assert subprocess.run([*run, "--version"], capture_output=True, timeout=60).returncode == 0


# ---- item 8: an argument that is no path and no spec ------------------------------------------
@pytest.mark.parametrize(
    "arg, message",
    [
        ("nonexistent_dir", "nonexistent_dir: no such file or directory (expected a PTC JSON file, a checkpoint "
                            "directory or a model spec such as gpt-1.3b:tp2,pp2,dp2@4x4)"),
        ("nonexistent_dir/", "nonexistent_dir/: no such file or directory"),
        ("gpt-tiny:tp2", "missing '@HOSTSxGPUS'"),  # a spec without its cluster is still a spec
        ("nope.json", "nope.json: cannot read: No such file or directory"),
    ],
    ids=["dir", "dir-slash", "spec-without-cluster", "json"],
)  # fmt: skip
def test_a_missing_argument_says_so(tenplex, arg, message):
    code, out, err = tenplex("inspect", arg)
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1 and message in err, err


def test_a_directory_where_a_ptc_is_needed_says_not_a_file(tenplex, tmp_path):
    code, out, err = tenplex("compile", str(tmp_path), "gpt-tiny:tp2@1x2")
    assert code == EXIT_USAGE and f"{tmp_path}: not a file (expected a PTC JSON file" in err, err


# ---- --json -----------------------------------------------------------------------------------
def test_inspect_json_of_a_ptc_has_the_facts_of_the_text(tenplex, tmp_path):
    path = write(tmp_path / "dst.json", dst_doc())
    code, text, _ = tenplex("inspect", path)
    code_json, out, err = tenplex("inspect", path, "--json")
    assert code == code_json == 0 and err == ""
    doc = json.loads(out)
    assert (doc["format"], doc["source"], doc["kind"]) == ("tenplex.inspect/1", path, "ptc")
    ptc = doc["ptc"]
    assert [p["id"] for p in ptc["partitions"]] == ["tp0", "tp1", "tp2", "tp3"]
    assert ptc["partitions"][3] == {"id": "tp3", "devices": [3], "hosts": ["h1"], "subtensors": 2, "bytes": 48,
                                    "values": ["iteration"]}  # fmt: skip
    totals = ptc["totals"]
    assert (totals["tensors"], totals["logical_bytes"], totals["held_bytes"], totals["hosts"]) == (2, 184, 192, ["h0", "h1"])
    assert totals["by_dtype"] == {"float16": {"tensors": 1, "bytes": 56}, "float32": {"tensors": 1, "bytes": 128}}
    assert ptc["notes"] and all(f"  - {note}" in text for note in ptc["notes"])


def test_inspect_json_of_a_spec_and_of_a_checkpoint_directory(tenplex, tmp_path):
    code, out, _ = tenplex("inspect", "gpt-tiny:tp2@1x2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["kind"] == "spec" and len(doc["ptc"]["partitions"]) == 2
    code, out, err = tenplex("reshard", "--help")
    assert "--json" in out
    ckpt = _checkpoint(tmp_path, tenplex)
    code, out, err = tenplex("inspect", str(ckpt), "--json")
    doc = json.loads(out)
    assert code == 0, err
    assert (doc["kind"], doc["checkpoint_format"]) == ("checkpoint", "tenplex")
    assert doc["findings"] == [f"tenplex checkpoint directory {ckpt}"] and len(doc["ptc"]["partitions"]) == 2


def _checkpoint(tmp_path: Path, tenplex) -> Path:
    """A tenplex checkpoint directory of gpt-tiny:tp2 (arange data)."""
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.arrays import arange_tensors, materialize
    from tenplex.runtime.checkpoint.directory import write_checkpoint

    ptc = ptc_from_spec("gpt-tiny:layers=1,hidden=64,heads=4,ffn=128,vocab=128,tp2@1x2")
    tensors = arange_tensors(ptc)
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}
    write_checkpoint(ptc, {st.id: materialize(ptc, tensors, st) for st in ptc.subtensors}, values, tmp_path / "ck")
    return tmp_path / "ck"


def test_reshard_json_of_a_tenplex_checkpoint(tenplex, tmp_path):
    ckpt = _checkpoint(tmp_path, tenplex)
    to = "gpt-tiny:layers=1,hidden=64,heads=4,ffn=128,vocab=128,tp1@1x1"
    code, out, err = tenplex("reshard", str(ckpt), "--to", to, "--out", str(tmp_path / "b"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "tenplex.reshard/1" and doc["verified"] is True
    assert (doc["src"], doc["src_format"], doc["out"], doc["out_format"]) == (str(ckpt), "tenplex", str(tmp_path / "b"), "tenplex")
    assert doc["workers"] == 1 and doc["bytes_moved"] > 0 and doc["seconds"]["total"] > 0
    assert doc["summary"].startswith(f"tenplex: resharded into {tmp_path / 'b'} with 1 worker(s)")


def test_store_ls_json(tenplex, tmp_path):
    save({"w": np.ones((2, 3), np.float32), "step": 7}, tmp_path / "s")
    code, out, err = tenplex("store", "ls", str(tmp_path / "s"), "--json")
    assert code == 0 and err == "", err
    doc = json.loads(out)
    assert doc == {"format": "tenplex.store-ls/1", "store": str(tmp_path / "s"), "kind": "save", "tensors": 1,
                   "bytes": 24, "leaves": [{"path": "/w", "kind": "array", "dtype": "float32", "shape": [2, 3],
                                            "bytes": 24}]}  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_the_agent_prints_its_control_line_and_logs_diagnostics(tmp_path):
    """`tenplex agent`: the line launchers wait for on stdout; a rejected connection is a
    warning through logging (`tenplex: agent NAME: ...` on stderr, shown with -q too)."""
    import os
    import select
    import signal

    from tenplex.runtime.agent.channel import ChannelError, dial

    (tmp_path / "token").write_text("the-right-token\n")
    sock = str(tmp_path / "a.sock")
    cmd = [sys.executable, "-m", "tenplex.cli", "-q", "agent", "--name", "a0", "--control", sock,
           "--token-file", str(tmp_path / "token")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert select.select([proc.stdout], [], [], 30)[0], "no control line within 30 s"
        assert proc.stdout.readline() == f"tenplex agent a0: control {sock}\n"
        with pytest.raises(ChannelError, match="rejected the connection"):
            dial(sock, "a-wrong-token", 5.0)
        assert select.select([proc.stderr], [], [], 30)[0], "no warning within 30 s"
        warning = proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "" and err == ""
    assert warning == "tenplex: agent a0: rejected a connection: unix socket: wrong token\n"
