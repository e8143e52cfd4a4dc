"""Hostile job files (issue 12, items 6 and 8): bytes that are not UTF-8, files that never end or
block, device counts without bound, and a hypothesis fuzz of JSON and YAML documents. Parsing
either succeeds or raises one JobFileError line naming the file; never another exception."""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenplex.elastic.errors import JobFileError
from tenplex.elastic.job import DEFAULT_MAX_DEVICES, MAX_DEVICES_CEILING, MAX_FILE_BYTES, load_job, parse_job
from tenplex.ir.errors import TenplexError

BASE = {"program": "train.py", "devices": 2}


def _one_line(e: BaseException) -> str:
    message = str(e)
    assert message and "\n" not in message, repr(message)
    return message


# ---- unreadable files -------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_non_utf8_job_file_is_one_line_naming_it(tmp_path, suffix):
    path = tmp_path / f"job{suffix}"
    path.write_bytes(b'{"program": "t\xff.py", "devices": 2}')
    with pytest.raises(JobFileError) as e:
        load_job(path)
    assert _one_line(e.value) == f"{path}: the job file is not UTF-8 text (byte 0xff at offset 14)"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize("target, kind", [("/dev/zero", "a character device"), ("fifo", "a fifo"), ("dir", "a directory")],
                         ids=["dev-zero", "fifo", "directory"])  # fmt: skip
def test_special_job_files_are_refused_without_reading(tmp_path, suffix, target, kind):
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")  # no writer: an open or read would block
        target = str(tmp_path / "fifo")
    elif target == "dir":
        (tmp_path / "d").mkdir()
        target = str(tmp_path / "d")
    path = tmp_path / f"job{suffix}"
    path.symlink_to(target)
    start = time.monotonic()
    with pytest.raises(JobFileError) as e:
        load_job(path)
    assert time.monotonic() - start < 5
    assert _one_line(e.value) == f"{path}: is {kind}, not a regular file (job file)"


def test_a_job_file_over_the_size_cap_is_refused(tmp_path):
    path = tmp_path / "job.json"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(JobFileError, match=re.escape(f"{path}: the job file is larger than 64 MiB")):
        load_job(path)


@pytest.mark.parametrize("suffix, text", [(".json", "[" * 100_000), (".yaml", "[" * 100_000)], ids=["json", "yaml"])
def test_deeply_nested_job_files_are_one_line(tmp_path, suffix, text):
    path = tmp_path / f"job{suffix}"
    path.write_text(text)
    with pytest.raises(JobFileError) as e:
        load_job(path)
    assert _one_line(e.value).startswith(f"{path}: not valid ")


# ---- the bound on devices ---------------------------------------------------------------------
def test_default_max_devices_is_documented_and_sane():
    assert DEFAULT_MAX_DEVICES == max(64, os.cpu_count() or 1) <= MAX_DEVICES_CEILING
    assert parse_job(BASE).max_devices == DEFAULT_MAX_DEVICES


DEVICE_BOUNDS = {
    "devices": ({**BASE, "devices": 100_000}, "job.devices: 100000 is more than max_devices {max}"),
    "event": ({**BASE, "schedule": [{"at_step": 2, "devices": 1_000_000}]},
              "job.schedule[0].devices: 1000000 is more than max_devices {max}"),
    "explicit": ({**BASE, "max_devices": 4, "schedule": [{"at_step": 2, "devices": 8}]},
                 "job.schedule[0].devices: 8 is more than max_devices 4"),
    "ceiling": ({**BASE, "max_devices": MAX_DEVICES_CEILING + 1},
                f"job.max_devices: expected an integer in 1..{MAX_DEVICES_CEILING}, got {MAX_DEVICES_CEILING + 1}"),
    "zero": ({**BASE, "max_devices": 0}, f"job.max_devices: expected an integer in 1..{MAX_DEVICES_CEILING}, got 0"),
    "initial_above_explicit": ({**BASE, "devices": 4, "max_devices": 2}, "job.devices: 4 is more than max_devices 2"),
}  # fmt: skip


@pytest.mark.parametrize("name", DEVICE_BOUNDS)
def test_devices_are_bounded_by_max_devices(name):
    doc, message = DEVICE_BOUNDS[name]
    with pytest.raises(JobFileError) as e:
        parse_job(doc, "job.json")
    assert _one_line(e.value) == "job.json: " + message.format(max=DEFAULT_MAX_DEVICES)


def test_max_devices_may_raise_the_default():
    spec = parse_job({**BASE, "devices": 200, "max_devices": 256, "schedule": [{"at_step": 1, "devices": 256}]})
    assert spec.max_devices == 256 and spec.devices == 200


# ---- other values that used to escape as tracebacks ----------------------------------------------
ODD = {
    "table_key_inf": ({**BASE, "parallel": {math.inf: [1, 1, 1]}}, "job.parallel.inf: the key must be a device count"),
    "table_key_none": ({**BASE, "parallel": {None: [1, 1, 1]}}, "job.parallel.None: the key must be a device count"),
    "timeout_inf": ({**BASE, "timeout": math.inf}, "job.timeout: expected a finite number > 0, got inf"),
    "timeout_nan": ({**BASE, "timeout": math.nan}, "job.timeout: expected a number > 0, got nan"),
    "seconds_inf": ({**BASE, "schedule": [{"at_seconds": math.inf, "devices": 1}]},
                    "job.schedule[0].at_seconds: expected a finite number > 0, got inf"),
    "program_nul": ({**BASE, "program": "a\0b"}, "job.program: a path may not hold a NUL byte, got 'a\\x00b'"),
    "arg_nul": ({**BASE, "args": ["--x", "a\0"]}, "job.args[1]: an argument may not hold a NUL byte, got 'a\\x00'"),
    "model_key": ({**BASE, "model": {1: 2}}, "job.model: unknown model field"),
    "model_layers": ({**BASE, "model": {"kind": "gpt", "num_layers": "x", "hidden": 64, "heads": 4,
                                        "ffn_hidden": 256, "vocab": 256}}, "job.model: "),
}  # fmt: skip


@pytest.mark.parametrize("name", ODD)
def test_odd_values_are_one_line_errors(name):
    doc, message = ODD[name]
    with pytest.raises(JobFileError) as e:
        parse_job(doc, "job.json")
    assert _one_line(e.value).startswith("job.json: " + message)


# ---- fuzz ---------------------------------------------------------------------------------------
KEYS = ["program", "args", "devices", "schedule", "parallel", "model", "gpus_per_host", "timeout", "recovery",
        "max_restarts", "max_devices", "at_step", "at_seconds", "tp", "pp", "fail", "num_layers", "kind", "bogus"]  # fmt: skip
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from([0, 1, 2, 4, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.sampled_from(["train.py", "4", "gpt", "\0"]),
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.integers(0, 8), inner, max_size=5)
    ),
    max_leaves=20,
)


@st.composite
def job_documents(draw) -> object:
    """A valid-looking job document, then mutated: fields replaced, added or removed."""
    doc: dict = {"program": "train.py", "devices": draw(st.integers(1, 8)),
                 "schedule": [{"at_step": 2, "devices": draw(st.integers(1, 8))}]}  # fmt: skip
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            doc[key] = draw(VALUES)
        else:
            doc.pop(key, None)
    if draw(st.booleans()):
        doc["schedule"] = draw(st.lists(VALUES, max_size=3))
    return doc if draw(st.integers(0, 9)) else draw(VALUES)


def _parses_or_one_line(path) -> None:
    try:
        load_job(path)
    except TenplexError as e:
        assert isinstance(e, JobFileError), type(e)
        assert str(path) in _one_line(e)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(doc=job_documents(), as_yaml=st.booleans())
def test_fuzzed_job_documents_parse_or_fail_on_one_line(tmp_path, doc, as_yaml):
    path = tmp_path / ("job.yaml" if as_yaml else "job.json")
    try:
        text = yaml.safe_dump(doc) if as_yaml else json.dumps(doc)
    except (ValueError, yaml.YAMLError):
        return  # not representable (a NaN key in JSON, ...)
    path.write_text(text)
    _parses_or_one_line(path)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    data=st.binary(max_size=64), as_yaml=st.booleans(), prefix=st.sampled_from([b"", b'{"program": "p", "devices": '])
)
def test_fuzzed_job_bytes_parse_or_fail_on_one_line(tmp_path, data, as_yaml, prefix):
    path = tmp_path / ("job.yaml" if as_yaml else "job.json")
    path.write_bytes(prefix + data)
    _parses_or_one_line(path)
