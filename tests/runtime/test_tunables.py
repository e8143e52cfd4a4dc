"""The agents' glibc copy tunables (`runtime.agent.tunables`): the environment a new agent
interpreter gets, and that glibc's dynamic loader reads the threshold from it (`ld.so
--list-tunables`, where the loader has that option: glibc >= 2.33 on x86-64)."""

from __future__ import annotations

import glob
import subprocess

import pytest

from tenplex.runtime.agent import tunables

THRESHOLD = f"{tunables.THRESHOLD}={tunables.NT_BYTES:#x}"


def test_the_threshold_is_added_to_the_other_tunables_and_a_set_one_is_kept():
    assert tunables.environ({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": THRESHOLD}
    got = tunables.environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert got["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{THRESHOLD}"
    mine = {"GLIBC_TUNABLES": f"{tunables.THRESHOLD}=0x10000000"}
    assert tunables.environ(mine) == mine


def _loader() -> str:
    found = sorted(glob.glob("/lib64/ld-linux-x86-64.so.2") + glob.glob("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
    if not found:
        pytest.skip("no x86-64 glibc loader here")
    return found[0]


def test_glibc_reads_the_threshold():
    loader = _loader()
    listed = subprocess.run([loader, "--list-tunables"], capture_output=True, text=True, env=tunables.environ({}))
    if listed.returncode != 0 or tunables.THRESHOLD not in listed.stdout:
        pytest.skip(f"{loader} does not list tunables")
    line = next(x for x in listed.stdout.splitlines() if x.startswith(tunables.THRESHOLD + ":"))
    assert line.split(":")[1].split()[0] == f"{tunables.NT_BYTES:#x}", line
