"""Wrong answers that looked right, and inputs that took minutes (issue 12, items 8 and 13):
`inspect` of a broken checkpoint exits 0; a full disk says "4096 requested and 992 written";
reshard errors start with a blank line; a DCP layout pattern that does not fit silently
replicates; a DCP mesh of 10^9 devices grows memory for minutes before any error."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fixtures.megatron.tree import build_tree  # noqa: E402
from tenplex.frameworks.dcp.format import DcpError  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.dtensor.boxes import PlacementError, Replicate  # noqa: E402
from tenplex.frameworks.dtensor.layout import TensorSpec, ptc_from_specs  # noqa: E402
from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc  # noqa: E402
from tenplex.frameworks.dtensor.state import ptc_from_state_dicts  # noqa: E402
from tenplex.frameworks.megatron.read import read_megatron  # noqa: E402
from tenplex.frameworks.megatron.tree import CheckpointFormatError  # noqa: E402
from tenplex.frameworks.megatron.write import write_megatron  # noqa: E402
from tenplex.frontends.spec import parse_spec, ptc_from_spec  # noqa: E402
from tenplex.ir.tensor import TensorMeta  # noqa: E402
from tenplex.runtime.arrays import arange_tensors, materialize  # noqa: E402
from tenplex.runtime.checkpoint import SerdeError, save  # noqa: E402
from tenplex.runtime.checkpoint.directory import CheckpointError, write_checkpoint, write_checkpoint_dir  # noqa: E402
from tests.frameworks.test_dcp_files import sharded_state  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(60)]
ENOSPC = r"cannot write: No space left on device \(ENOSPC\)"


def _values(ptc):
    return {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}


def _tenplex_triple():
    src = ptc_from_spec("gpt-tiny:tp2@1x2")
    tensors = arange_tensors(src)
    return src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, _values(src)


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    root = tmp_path_factory.mktemp("meg") / "m"
    spec = parse_spec("gpt-tiny:tp1,pp1@1x1")
    build_tree(root, spec.model, spec.parallel)
    return root


def _dcp_triple():
    return ptc_from_state_dicts([{"w": np.zeros(20000, np.float32), "step": 3} for _ in range(2)])


# ---- the writers on a full disk: one line naming the path and ENOSPC; nothing left ----------


def _writers(megatron: Path):
    return {
        "tenplex": lambda out: write_checkpoint_dir(*_tenplex_triple(), out),
        "save": lambda out: save({"w": np.zeros(100000)}, out),
        "megatron": lambda out: write_megatron(*(ck := read_megatron(megatron)), ck.meta, out),
        "dcp": lambda out: write_dcp(*_dcp_triple(), out),
    }


ERRORS = {"tenplex": CheckpointError, "save": SerdeError, "megatron": CheckpointFormatError, "dcp": DcpError}


@pytest.fixture
def tiny_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(ERRORS))
def test_full_disk_real(fmt, megatron, tiny_disk):
    with pytest.raises(ERRORS[fmt], match=rf"{tiny_disk / 'out'}\S*: {ENOSPC}") as info:
        _writers(megatron)[fmt](tiny_disk / "out")
    assert "\n" not in str(info.value)
    assert list(tiny_disk.iterdir()) == []  # no output, no temporary


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fmt", sorted(ERRORS))
def test_full_disk_simulated(fmt, megatron, tmp_path, monkeypatch):
    from tenplex.frameworks.dcp import write as dcp_write
    from tenplex.runtime.checkpoint import directory, write

    monkeypatch.setattr(directory, "write_npy", _enospc)
    monkeypatch.setattr(write, "write_npy", _enospc)
    monkeypatch.setattr(dcp_write, "_write_all", _enospc)  # the .distcp files' bytes
    if fmt == "megatron":
        monkeypatch.setattr(torch, "save", _enospc)
    with pytest.raises(ERRORS[fmt], match=rf"{tmp_path / 'out'}\S*: {ENOSPC}"):
        _writers(megatron)[fmt](tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- inspect of a checkpoint that cannot be read exits 2 ---------------------------------------


def _broken_dirs(tmp_path: Path, megatron: Path) -> dict[str, Path]:
    out = {}
    out["megatron"] = Path(shutil.copytree(megatron, tmp_path / "m"))
    next(out["megatron"].rglob("model_optim_rng.pt")).write_bytes(b"junk")
    write_dcp(*sharded_state(), tmp_path / "d")
    (tmp_path / "d" / "__1_0.distcp").unlink()
    out["dcp"] = tmp_path / "d"
    write_checkpoint(*_tenplex_triple(), tmp_path / "t")
    next((tmp_path / "t").rglob("*.npy")).write_bytes(b"\x93NUMPY")
    out["tenplex"] = tmp_path / "t"
    return out


@pytest.mark.parametrize("fmt", ["megatron", "dcp", "tenplex"])
def test_inspect_of_a_broken_checkpoint_exits_2(fmt, megatron, tmp_path, tenplex):
    root = _broken_dirs(tmp_path, megatron)[fmt]
    code, out, err = tenplex("inspect", str(root))
    assert code == 2 and err.startswith(f"tenplex: error: {root}") and err.count("\n") == 1, (code, out, err)


# ---- reshard errors: the error is the first line on stderr --------------------------------------


def test_reshard_error_is_the_first_line_on_stderr(tmp_path):
    write_checkpoint(*_tenplex_triple(), tmp_path / "a")
    (next((tmp_path / "a").rglob("*.npy"))).write_bytes(b"junk")
    done = subprocess.run([sys.executable, "-m", "tenplex.cli", "reshard", str(tmp_path / "a"), "--to", "gpt-tiny:tp1@1x1",
                           "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("tenplex: error: "), repr(done.stderr)
    assert not (tmp_path / "b").exists()


# ---- DCP layouts: patterns that do not fit, meshes past any real job ---------------------------


def test_pattern_that_does_not_fit_is_refused():
    src, _, _ = sharded_state()
    with pytest.raises(PlacementError, match=r"layout placements\['model\.\*'\] = \['S\(5\)'\] match tensor 'model\.b' "
                                             r"of shape \[3\], but S\(5\) shards dim 5 of a 1-d tensor"):  # fmt: skip
        dst_ptc(src, MeshLayout((2,), {"model.*": ["S(5)"]}))


@pytest.mark.parametrize("mesh", [[10**9], [1 << 10, 1 << 10, 1 << 10], [1] * 100], ids=["1e9", "2^30", "100_dims"])
def test_mesh_past_any_job_is_refused_at_once(mesh):
    with pytest.raises(PlacementError, match=r"mesh shape .* (devices|dims), more than"):
        MeshLayout.from_json(json.dumps({"mesh": mesh}))


def test_layout_whose_ptc_would_not_fit_in_memory_is_refused(monkeypatch):
    from tenplex.frameworks.dtensor import layout

    src, _, _ = sharded_state()
    monkeypatch.setattr(layout, "MAX_SUBTENSORS", 1000)
    with pytest.raises(PlacementError, match=r"\d+ sub-tensors .* more than 1000"):
        dst_ptc(src, MeshLayout((512,)))
    with pytest.raises(PlacementError, match=r"\d+ sub-tensors .* more than 1000"):
        ptc_from_specs(2048, [TensorSpec(TensorMeta("w", (4,), "float32"), (2048,), (Replicate(),))])


@pytest.mark.timeout(10)
def test_metadata_memo_index_bomb_is_refused_at_once(tmp_path):
    """LONG_BINPUT 2^32-16 would make the C unpickler allocate a 32 GiB memo table."""
    from tenplex.frameworks.dcp.read import read_dcp

    write_dcp(*sharded_state(), tmp_path / "d")
    (tmp_path / "d" / ".metadata").write_bytes(b"\x80\x04N" + b"r" + (2**32 - 16).to_bytes(4, "little") + b".")
    with pytest.raises(DcpError, match=r"\.metadata: not a readable DCP metadata file \(UnpicklingError: memo index 4294967280"):
        read_dcp(tmp_path / "d")


def test_metadata_planner_data_that_is_no_key_path_is_refused(tmp_path):
    """planner_data becomes OUT's flatten mapping: a value that is no key path would crash the writer."""
    import pickle

    from tenplex.frameworks.dcp.read import read_dcp

    write_dcp(*sharded_state(), tmp_path / "d")
    md = pickle.loads((tmp_path / "d" / ".metadata").read_bytes())
    md.planner_data["model.w"] = 5
    (tmp_path / "d" / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(DcpError, match=r"\.metadata: planner_data maps 'model\.w' to 5, not to a key path"):
        read_dcp(tmp_path / "d")
