"""A SIGTERM that lands just as something is started, where `tenplex reshard` turns it into an
exception (`cli.app.main`): the started thing must not outlive the exception. Found by
tests/security/test_agent_faults.py, which signals a reshard once its temporary exists."""

import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import atomic_dir
from tenplex.runtime.checkpoint.prealloc import Preallocation


@pytest.fixture
def sigterm_raises():
    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, terminated)
    yield
    signal.signal(signal.SIGTERM, old)


@pytest.fixture(params=["one thread", "two threads"])
def threads(request):
    """A second Python thread besides the native ones (numpy's BLAS threads): the kernel gives a
    process-directed signal to any thread that does not hold it, and Python runs its handler in
    the main thread. Holding the signals in the main thread alone failed both cases."""
    if request.param == "one thread":
        yield
        return
    done = threading.Event()
    second = threading.Thread(target=done.wait)
    second.start()
    yield
    done.set()
    second.join()


def test_a_sigterm_as_the_preallocation_helper_starts_stops_the_helper(tmp_path, monkeypatch, sigterm_raises, threads):
    started = subprocess.Popen.__init__
    helpers = []  # held here: a Popen dropped unwaited is reaped by its __del__, hiding the loss

    def signalled_in_popen(self, *args, **kwargs):  # the helper exists; Popen has not returned yet
        started(self, *args, **kwargs)
        helpers.append(self)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)

    monkeypatch.setattr(subprocess.Popen, "__init__", signalled_in_popen)
    with pytest.raises(SystemExit):
        Preallocation(tmp_path, [("a.npy", 1 << 20)])
    assert len(helpers) == 1
    (helper,) = helpers
    try:
        assert helper.returncode is not None, "the helper outlived the SIGTERM (it would go on creating files)"
    finally:
        helper.kill()
        helper.wait()


def test_a_sigterm_just_after_the_temporary_is_made_removes_it(tmp_path, monkeypatch, sigterm_raises):
    made = tempfile.mkdtemp

    def signalled_in_mkdtemp(*args, **kwargs):  # the directory exists; mkdtemp has not returned yet
        path = made(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", signalled_in_mkdtemp)
    with pytest.raises(SystemExit), atomic_dir(tmp_path / "out", TenplexError):
        pass
    assert list(tmp_path.iterdir()) == []
