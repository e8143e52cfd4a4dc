"""Faults injected into real processes: a stopped (SIGSTOP) agent, Ctrl-C and SIGTERM during a
reshard, an idle connection to an agent, unsafe REST settings, a load that fails on one host.
Whatever happens, the command ends within seconds, the source is intact, the output is complete
or absent, and no temporary is left behind."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import arange_tensors, materialize, materialize_all
from tenplex.runtime.checkpoint.directory import write_checkpoint
from tenplex.runtime.runtime import Runtime
from tenplex.runtime.transport.ucx import ucx_available

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(ucx_available() is not None, reason=f"ucxx cannot be imported: {ucx_available()}"),
]
ROOT = Path(__file__).resolve().parents[2]
# 86 MiB: enough that a reshard's workers live long enough to be stopped while they work
SRC, DST = "gpt-tiny:tp2,pp2,hidden=512@1x4", "gpt-tiny:tp4,pp1,hidden=512@1x4"
JOB = "j"


def _is_agent(pid: int, parent: int) -> bool:
    """An agent the reshard started: spawned by multiprocessing, or forked (the parent's command line)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        return "spawn" in cmdline or cmdline == Path(f"/proc/{parent}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def _in_fork(pid: int) -> bool:
    """Whether `pid` waits in the kernel for a child it is making (a vfork child that has not
    exec'd yet: while that child is stopped, no signal reaches the parent)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() in ("kernel_clone", "wait_for_vfork_done")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _process_tree(pid: int) -> str:
    """`pid` and its children: state, kernel wait channel and command line of each, of each
    thread, and their Python stacks where py-spy is installed (what a hang is waiting for)."""
    lines = []
    for p in [pid, *_children(pid)]:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_text(errors="replace").replace("\0", " ")[:160]
            status = Path(f"/proc/{p}/status").read_text().splitlines()
            signals = " ".join(line.replace("\t", "") for line in status if line.startswith(("State", "Sig", "ShdPnd")))
            lines.append(f"{p} {cmd}\n  {signals}")
            for task in sorted(Path(f"/proc/{p}/task").iterdir()):
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                comm, wchan = (task / "comm").read_text().strip(), (task / "wchan").read_text()
                lines.append(f"  thread {task.name} {comm} {state} {wchan}")
        if shutil.which("py-spy"):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(p)], capture_output=True, text=True, timeout=30)
            lines.append(dump.stdout + dump.stderr)
    return "\n".join(lines)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    src = ptc_from_spec(SRC)
    tensors = arange_tensors(src)
    root = tmp_path_factory.mktemp("faults") / "src"
    values = {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in src.partitions}
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, values, root)
    return root


def _reshard(src: Path, out: Path) -> subprocess.Popen:
    """`tenplex reshard --workers 2`, started as from a terminal: with SIGINT at its default
    also where the tests run with it ignored (a background job of a non-interactive shell
    ignores SIGINT and SIGQUIT, its children inherit that, and Python then installs no
    KeyboardInterrupt: Ctrl-C would rightly do nothing, and the Ctrl-C test hung so)."""
    cmd = [sys.executable, "-m", "tenplex.cli", "reshard", str(src), "--to", DST, "--out", str(out), "--workers", "2"]
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handler: the child starts at SIG_DFL
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.timeout(120)
def test_a_stopped_agent_is_found_silent_and_killed():
    with Runtime.local(["h0", "h1"], timeout=10.0, round_timeout=60.0, liveness=2.0) as rt:
        victim = rt.agents["h1"].proc
        os.kill(victim.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(ExecutionError, match=r"host 'h1': exists: silent for 2 s \(stopped or hung\?\); agent killed"):
            rt.exists(JOB, "v0")
        assert time.monotonic() - start < 10
        assert not victim.is_alive()
        assert rt.call("h0", "exists", path="/job/j") is False  # the other agent still answers


def _stop_an_agent(proc: subprocess.Popen) -> tuple[int | None, list[int]]:
    """SIGSTOP one of the reshard `proc`'s agents once it has been seen for 50 ms; (its pid, or
    None where the reshard ended first, and the agents seen last)."""
    deadline = time.monotonic() + 60
    agents, since = [], {}
    while time.monotonic() < deadline and proc.poll() is None:
        agents = [p for p in _children(proc.pid) if _is_agent(p, proc.pid)]
        now = time.monotonic()
        # an agent seen for 50 ms: a child between vfork and exec (a subprocess the reshard
        # starts) also has the parent's command line, and stopping it blocks the parent in the
        # kernel, where no signal reaches it; one that is still there: one may have finished
        for pid in agents:
            if now - since.setdefault(pid, now) < 0.05 or not _is_agent(pid, proc.pid):
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            time.sleep(0.02)
            if _in_fork(proc.pid):  # it was a vfork child after all (or one is being made): let it go on
                os.kill(pid, signal.SIGCONT)
                continue
            return pid, agents
        time.sleep(0.01)
    return None, agents


@pytest.mark.timeout(180)
def test_ctrl_c_ends_a_reshard_whose_agent_is_stopped(checkpoint, tmp_path):
    before = _files(checkpoint)
    out = tmp_path / "out"
    for _ in range(5):  # on an idle machine the reshard may end before an agent has lived 50 ms
        proc = _reshard(checkpoint, out)
        stopped, agents = _stop_an_agent(proc)
        if stopped is not None or proc.wait(60) != 0:
            break
        shutil.rmtree(out)
    assert stopped is not None, f"no agent of the reshard could be stopped (exit code {proc.poll()})"
    time.sleep(1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        state = _process_tree(proc.pid)
        for pid in [proc.pid, *agents]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the reshard did not end 20 s after Ctrl-C (agent {stopped} stopped):\n{state}")
    assert time.monotonic() - start < 10, "Ctrl-C took longer than a few seconds"
    assert code == 130, proc.stderr.read()
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
    assert _files(checkpoint) == before
    for pid in agents:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.timeout(180)
def test_sigterm_leaves_no_temporary_and_a_dead_writers_temporary_is_cleaned(checkpoint, tmp_path):
    out = tmp_path / "out"
    proc = _reshard(checkpoint, out)
    deadline = time.monotonic() + 60  # signal once its temporary exists: mid-write, handler installed
    while not list(tmp_path.glob(f".out.tmp-{proc.pid}-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(20)
    assert code in (0, 143), proc.stderr.read()
    assert out.exists() == (code == 0)
    assert not list(tmp_path.glob(f".out.tmp-{proc.pid}-*")), "SIGTERM left a temporary behind"
    stale = tmp_path / f".again.tmp-{2**22 + 12345}-abcd"  # the temporary of a writer killed with SIGKILL
    (stale / "x").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "tenplex.cli", "reshard", str(checkpoint), "--to", DST, "--out",
                           str(tmp_path / "again")], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not stale.exists(), "the temporary of a dead writer of OUT was not removed"


def _agent(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tenplex.cli", "agent", "--name", "h0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})})  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_an_idle_connection_does_not_lock_out_a_runtime(tmp_path):
    port = _free_port()
    agent = _agent(tmp_path, "--control", f"127.0.0.1:{port}", env={"TENPLEX_AGENT_TOKEN": "s3cret"})
    try:
        assert agent.stdout.readline().startswith("tenplex agent h0: control")
        idle = socket.create_connection(("127.0.0.1", port))  # connects, never says a word
        start = time.monotonic()
        with Runtime.connect({"h0": f"127.0.0.1:{port}"}, token="s3cret", start_timeout=20) as rt:
            assert rt.exists(JOB, "v0") == {"h0": False}
        assert time.monotonic() - start < 12
        idle.close()
    finally:
        agent.terminate()
        assert agent.wait(10) == 0


@pytest.mark.parametrize("args, env, message", [
    (["--rest", "0.0.0.0:0"], {}, "serving the store beyond loopback needs a REST token"),
    (["--rest", "127.0.0.1:99999"], {}, "expected \\[HOST\\]:PORT with a port in 0..65535"),
    (["--rest", "127.0.0.1:0"], {"TENPLEX_REST_TOKEN": "same"}, "the REST token must differ from the control token"),
])  # fmt: skip
def test_unsafe_or_malformed_rest_settings_are_refused_before_anything_starts(tmp_path, args, env, message):
    sock = tmp_path / "h0.sock"
    agent = _agent(tmp_path, "--control", str(sock), *args, env={"TENPLEX_AGENT_TOKEN": "same", **env})
    out, err = agent.communicate(timeout=30)
    assert agent.returncode == 2 and err.count("\n") == 1 and err.startswith("tenplex: error: "), err
    assert message in err or __import__("re").search(message, err), err
    assert not sock.exists()


@pytest.mark.timeout(60)
def test_rest_on_an_ipv6_loopback_and_a_separate_token(tmp_path):
    sock = tmp_path / "h0.sock"
    agent = _agent(tmp_path, "--control", str(sock), "--rest", "[::1]:0", env={"TENPLEX_REST_TOKEN": "r3st"})
    try:
        line = agent.stdout.readline()
        assert "REST http://[::1]:" in line, line + agent.stderr.read()
    finally:
        agent.terminate()
        assert agent.wait(10) == 0
    assert not sock.exists(), "the agent left its control socket behind"


@pytest.mark.timeout(120)
def test_a_load_that_fails_on_one_host_leaves_no_part_of_the_state():
    src = ptc_from_spec("gpt-tiny:tp2@2x1")
    arrays = materialize_all(src, arange_tensors(src))
    with Runtime.local(["h0", "h1"], timeout=10.0, round_timeout=60.0) as rt:
        rt.load(JOB, "v0", src, arrays, {})
        old = rt.fetch(JOB, "v0")[0]
        twice = {k: a * 2 for k, a in arrays.items()}
        cannot_travel = {(p.id, 1): {"x": {1, 2}} for p in src.partitions if 1 in src.allocation.devices_of(p.id)}
        with pytest.raises(ExecutionError, match="loading /job/j/v0 failed; no host kept any of it"):
            rt.load(JOB, "v0", src, twice, cannot_travel)
        got = rt.fetch(JOB, "v0")[0]
        assert set(got) == set(old) and all(got[k].tobytes() == old[k].tobytes() for k in old)
        assert rt.exists(JOB, ".staging-v0") == {"h0": False, "h1": False}


@pytest.mark.timeout(60)
def test_the_agent_store_is_bounded_and_a_large_upload_is_refused(tmp_path):
    import re
    import urllib.error
    import urllib.request

    sock = tmp_path / "h0.sock"
    agent = _agent(tmp_path, "--control", str(sock), "--rest", "127.0.0.1:0", "--memory-budget", "1MiB")
    try:
        url = re.search(r"REST (http://\S+)", agent.stdout.readline())[1]
        body = bytes(2 << 20)
        request = urllib.request.Request(f"{url}/upload?path=/big&dtype=uint8&shape={len(body)}", data=body, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as e:
            opener.open(request, timeout=10)
        assert e.value.code == 409 and "budget" in e.value.read().decode()
        small = urllib.request.Request(f"{url}/upload?path=/small&dtype=uint8&shape=4", data=b"abcd", method="POST")
        assert opener.open(small, timeout=10).status == 201
    finally:
        agent.terminate()
        assert agent.wait(10) == 0
