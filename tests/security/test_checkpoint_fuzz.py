"""Fuzzing the checkpoint readers with corrupted real checkpoints (issue 12, "make the pass
repeatable"): a tenplex checkpoint directory and a DCP directory, both written by tenplex's own
writers from the DCP tests' sharded state, and a Megatron tree from the fixture builder, get one
file flipped, truncated, replaced with random
bytes or random JSON, deleted, turned into a fifo or a symlink leading out. Reading (and
`tenplex inspect`) must then either succeed, returning arrays that match the PTC it returns, or
raise a TenplexError subclass: never another exception, never a hang.

(A flip inside array bytes reads back as other numbers: neither format has checksums, so
"succeeds" cannot mean "the original bytes"; it means "a consistent checkpoint".)"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from tenplex.frameworks.dcp.read import read_dcp  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.formats import inspect  # noqa: E402
from tenplex.frameworks.megatron.read import read_megatron  # noqa: E402
from tenplex.frontends.spec import parse_spec  # noqa: E402
from tenplex.ir.errors import TenplexError  # noqa: E402
from tenplex.ir.ptc import PTC  # noqa: E402
from tenplex.runtime.arrays import np_dtype  # noqa: E402
from tenplex.runtime.checkpoint.directory import read_checkpoint, write_checkpoint  # noqa: E402
from tests.frameworks.test_dcp_files import sharded_state  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(300)]
# TENPLEX_FUZZ_EXAMPLES=5000 for a longer hunt; the profile's derandomize (ci) still applies
FUZZ = settings(deadline=5000, max_examples=int(os.environ.get("TENPLEX_FUZZ_EXAMPLES", "60")),
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def corruptions(draw, files: list[str]) -> tuple[str, str, object]:
    """(file, kind, argument): what to do to one file of the checkpoint."""
    file = draw(st.sampled_from(files))
    kind = draw(st.sampled_from(["flip", "truncate", "bytes", "json", "delete", "fifo", "symlink_out"]))
    if kind == "flip":
        arg = draw(st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), min_size=1, max_size=4))
    elif kind == "truncate":
        arg = draw(st.integers(0, 1 << 16))
    elif kind == "bytes":
        arg = draw(st.binary(max_size=256))
    elif kind == "json":
        arg = json.dumps(draw(json_values)).encode()
    else:
        arg = None
    return file, kind, arg


def _corrupt(root: Path, outside: Path, file: str, kind: str, arg: object) -> None:
    path = root / file
    data = path.read_bytes()
    if kind == "flip":
        buf = bytearray(data)
        for offset, mask in arg:  # type: ignore[union-attr]
            if buf:
                buf[offset % len(buf)] ^= mask
        path.write_bytes(bytes(buf))
    elif kind == "truncate":
        path.write_bytes(data[: arg % (len(data) + 1)])  # type: ignore[operator]
    elif kind in ("bytes", "json"):
        path.write_bytes(arg)  # type: ignore[arg-type]
    else:
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink_out":
            path.symlink_to(outside)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _check_consistent(ptc: PTC, arrays: dict, values: dict) -> None:
    for sub in ptc.subtensors:
        a = arrays[sub.id]
        assert a.shape == sub.shape and a.dtype == np_dtype(ptc.tensor_map[sub.tensor].dtype), sub.id
    assert set(values) == {p.id for p in ptc.partitions}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("pristine")
    write_dcp(*sharded_state(), base / "dcp")
    write_checkpoint(*read_dcp(base / "dcp", mmap=False), base / "tenplex")  # NaN and tuples as opaque values
    from fixtures.megatron.tree import build_tree

    spec = parse_spec("gpt-tiny:tp1,pp2@1x2")
    build_tree(base / "megatron", spec.model, spec.parallel)
    np.save(base / "outside.npy", np.arange(12, dtype=np.float32))
    return base


def _fuzz(pristine: Path, fmt: str, read, corruption) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(pristine / fmt, Path(tmp) / "ck"))
        _corrupt(root, pristine / "outside.npy", *corruption)
        try:
            got = read(root)
        except TenplexError as e:
            assert "\n" not in str(e).strip(), str(e)
        else:
            _check_consistent(*got)
        with contextlib.suppress(TenplexError):
            inspect(str(root))


@pytest.fixture(scope="module")
def tenplex_files(pristine):
    return _files(pristine / "tenplex")


@pytest.fixture(scope="module")
def dcp_files(pristine):
    return _files(pristine / "dcp")


def test_fuzz_tenplex_directory(pristine, tenplex_files):
    @FUZZ
    @given(st.data())
    def run(data):
        weighted = ["ptc.json"] * 4 + [f for f in tenplex_files if f.endswith("values.json")] * 2 + tenplex_files
        _fuzz(pristine, "tenplex", read_checkpoint, data.draw(corruptions(weighted)))

    run()


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "copy"])
def test_fuzz_dcp_directory(pristine, dcp_files, mmap):
    @FUZZ
    @given(st.data())
    def run(data):
        weighted = [".metadata"] * 6 + dcp_files
        _fuzz(pristine, "dcp", lambda root: read_dcp(root, mmap=mmap), data.draw(corruptions(weighted)))

    run()


def test_fuzz_megatron_tree(pristine):
    files = _files(pristine / "megatron")

    @settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 3))
    @given(st.data())
    def run(data):
        _fuzz(pristine, "megatron", lambda root: tuple(read_megatron(root)), data.draw(corruptions(files)))

    run()
