"""Untrusted checkpoint directories and saves on disk (issue 12, items 4, 5, 8 and 12):
aliased sub-tensor paths, `tenplex.load` importing modules or reading outside the save, `.npy`
headers that claim more than the file holds, and fifos where a checkpoint needs a file. Every
bad input is a one-line TenplexError naming the file; nothing hangs, nothing is imported."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC, Partition
from tenplex.runtime.arrays import arange_tensors, materialize
from tenplex.runtime.checkpoint import MANIFEST, SerdeError, load, save
from tenplex.runtime.checkpoint.directory import CheckpointError, read_checkpoint, relative_paths, write_checkpoint

pytestmark = pytest.mark.timeout(30)  # a fifo opened for reading would block forever

Point = collections.namedtuple("Point", ["x", "y"])


def _values(ptc: PTC) -> dict[str, dict]:
    return {p.id: {n: v.value if v.value is not None else 7 for n, v in p.values} for p in ptc.partitions}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    src = ptc_from_spec("gpt-tiny:tp2@1x2")
    tensors = arange_tensors(src)
    root = tmp_path_factory.mktemp("ck") / "a"
    write_checkpoint(src, {st.id: materialize(src, tensors, st) for st in src.subtensors}, _values(src), root)
    return src, root


def _copy(root: Path, to: Path) -> Path:
    shutil.copytree(root, to)
    return to


def _with_paths(ptc: PTC, paths: dict[str, str]) -> PTC:
    subs = [type(s)(s.id, s.tensor, paths.get(s.id, s.path), s.shape, s.pieces, s.fill) for s in ptc.subtensors]
    return PTC(ptc.tensors, subs, ptc.partitions, ptc.allocation, ptc.topology)


# ---- item 4: one spelling per file ------------------------------------------------------------


@pytest.mark.parametrize("alias", ["{d}/./{f}", "{d}//{f}", "./{d}/{f}", "{d}/{f}/", "{d}/{f}\0", "{d}/../{d}/{f}"],
                         ids=["dot", "empty", "leading_dot", "trailing_slash", "nul", "dotdot"])  # fmt: skip
def test_aliased_subtensor_paths_are_refused(ckpt, alias):
    src, _ = ckpt
    first, second = src.partitions[0].subtensors[:2]
    d, f = src.subtensor_map[first].path.rsplit("/", 1)
    with pytest.raises(TenplexError, match=r"cannot be a relative file path|contains a NUL byte"):  # the IR may refuse NUL first
        relative_paths(_with_paths(src, {second: alias.format(d=d, f=f)}))


def test_paths_of_two_partitions_that_name_one_file_are_refused(ckpt):
    src, _ = ckpt
    a, b = src.partitions[:2]
    sid_a, sid_b = a.subtensors[0], b.subtensors[0]
    # partition 'tp0' path 'q/w' and partition 'tp0/q' path 'w' are both tp0/q/w.npy
    parts = [Partition(f"{a.id}/q", p.subtensors, dict(p.values)) if p.id == b.id else p for p in src.partitions]
    alloc = {(f"{a.id}/q" if pid == b.id else pid): devs for pid, devs in src.allocation.items}
    ptc = PTC(src.tensors, _with_paths(src, {sid_a: "q/w", sid_b: "w"}).subtensors, parts,
              type(src.allocation)(alloc), src.topology)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"share path '.*/q/w\.npy'"):
        relative_paths(ptc)


def test_a_file_that_another_path_needs_as_a_directory_is_refused(ckpt):
    src, _ = ckpt
    first, second = src.partitions[0].subtensors[:2]
    ptc = _with_paths(src, {first: "x", second: "x.npy/y"})  # x.npy is a file and a directory
    with pytest.raises(CheckpointError, match=r"sub-tensor .* names file '.*/x\.npy', which '.*/x\.npy/y\.npy' needs as a directory"):
        relative_paths(ptc)


def test_nul_in_partition_id_is_refused(ckpt):
    src, _ = ckpt
    a = src.partitions[0]
    alloc = {("tp\0" if pid == a.id else pid): devs for pid, devs in src.allocation.items}
    with pytest.raises(TenplexError, match=r"partition id 'tp\\x00' (cannot be a relative file path|contains a NUL byte)"):
        parts = [Partition("tp\0", p.subtensors, dict(p.values)) if p.id == a.id else p for p in src.partitions]
        relative_paths(PTC(src.tensors, src.subtensors, parts, type(src.allocation)(alloc), src.topology))


def test_a_ptc_json_with_aliased_paths_does_not_read(ckpt, tmp_path):
    src, root = ckpt
    bad = _copy(root, tmp_path / "bad")
    doc = json.loads((bad / "ptc.json").read_text())
    first, second = src.partitions[0].subtensors[:2]
    doc["subtensors"][second]["path"] = doc["subtensors"][first]["path"].replace("/", "/./", 1)
    (bad / "ptc.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="cannot be a relative file path"):
        read_checkpoint(bad)


# ---- item 8: .npy headers that claim more than the file holds --------------------------------


def _huge_npy(path: Path) -> None:
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 64)


def test_checkpoint_npy_claiming_a_terabyte_is_one_line(ckpt, tmp_path):
    src, root = ckpt
    bad = _copy(root, tmp_path / "bad")
    st = src.subtensors[0]
    victim = bad / src.partition_of[st.id] / f"{st.path}.npy"
    _huge_npy(victim)
    with pytest.raises(CheckpointError, match=rf"{victim}: header claims float32\[1000000, 1000000\] \(4000000000000 bytes\) but the file holds 64 bytes"):
        read_checkpoint(bad)


def test_load_npy_claiming_a_terabyte_is_one_line(tmp_path):
    save({"w": np.ones(3)}, tmp_path / "s")
    _huge_npy(tmp_path / "s" / "w.npy")
    with pytest.raises(SerdeError, match=r"w\.npy.*header claims float32\[1000000, 1000000\]"):
        load(tmp_path / "s")


# ---- item 12: fifos ---------------------------------------------------------------------------


def _fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def test_fifo_in_a_checkpoint_directory_is_refused(ckpt, tmp_path):
    src, root = ckpt
    bad = _copy(root, tmp_path / "bad")
    st = src.subtensors[0]
    victim = _fifo(bad / src.partition_of[st.id] / f"{st.path}.npy")
    with pytest.raises(CheckpointError, match=rf"{victim}: is a fifo, not a regular file"):
        read_checkpoint(bad)
    bad = _copy(root, tmp_path / "bad2")
    victim = _fifo(bad / src.partitions[0].id / "values.json")
    with pytest.raises(CheckpointError, match=rf"{victim}: is a fifo, not a regular file"):
        read_checkpoint(bad)


@pytest.mark.parametrize("name", ["w.npy", MANIFEST])
def test_fifo_in_a_save_is_refused(tmp_path, name):
    save({"w": np.ones(3)}, tmp_path / "s")
    victim = _fifo(tmp_path / "s" / name)
    with pytest.raises(SerdeError, match=rf"{victim}.*is a fifo, not a regular file"):
        load(tmp_path / "s")


# ---- item 5: tenplex.load imports nothing and reads nothing outside the save ----------------


def _edit_manifest(root: Path, edit) -> None:
    doc = json.loads((root / MANIFEST).read_text())
    edit(doc["root"])
    (root / MANIFEST).write_text(json.dumps(doc))


def test_load_never_imports_the_module_a_namedtuple_names(tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "mods" / "evil_mod_12.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport collections\nPoint = collections.namedtuple('Point', ['x', 'y'])\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    save({"p": Point(1, 2)}, tmp_path / "s")
    _edit_manifest(tmp_path / "s", lambda n: n["items"][0][1].update({"class": "evil_mod_12:Point"}))
    got = load(tmp_path / "s")["p"]
    assert not marker.exists() and "evil_mod_12" not in sys.modules
    assert type(got).__name__ == "Point" and got._fields == ("x", "y") and tuple(got) == (1, 2)


def test_load_uses_a_namedtuple_class_already_imported(tmp_path):
    save({"p": Point(1, 2)}, tmp_path / "s")
    assert type(load(tmp_path / "s")["p"]) is Point


@pytest.mark.parametrize("file", ["../outside.npy", "/tmp/outside.npy", "a/../w.npy", "./w.npy", "a//w.npy", "w.npy\0"],
                         ids=["dotdot", "absolute", "inner_dotdot", "dot", "empty", "nul"])  # fmt: skip
def test_load_refuses_files_outside_the_save(tmp_path, file):
    np.save(tmp_path / "outside.npy", np.ones(3))
    save({"w": np.zeros(3)}, tmp_path / "s")
    _edit_manifest(tmp_path / "s", lambda n: n["items"][0][1].update({"file": file}))
    with pytest.raises(SerdeError, match=re.escape(str(tmp_path / "s" / MANIFEST)) + ".*" + re.escape(f"file {file!r}")):
        load(tmp_path / "s")


def test_load_refuses_a_symlink_leading_out_of_the_save(tmp_path):
    np.save(tmp_path / "outside.npy", np.ones(3))
    save({"w": np.zeros(3)}, tmp_path / "s")
    (tmp_path / "s" / "w.npy").unlink()
    (tmp_path / "s" / "w.npy").symlink_to(tmp_path / "outside.npy")
    with pytest.raises(SerdeError, match=r"w\.npy.*leads outside"):
        load(tmp_path / "s")


def test_fifo_in_a_megatron_tree_or_dcp_directory_is_refused(tmp_path):
    pytest.importorskip("torch")
    from fixtures.megatron.tree import build_tree
    from tenplex.frameworks.dcp.format import DcpError
    from tenplex.frameworks.dcp.read import read_dcp
    from tenplex.frameworks.dcp.write import write_dcp
    from tenplex.frameworks.megatron.read import read_megatron
    from tenplex.frameworks.megatron.tree import CheckpointFormatError
    from tenplex.frontends.spec import parse_spec
    from tests.frameworks.test_dcp_files import sharded_state

    spec = parse_spec("gpt-tiny:tp2,pp1@1x2")
    build_tree(tmp_path / "m", spec.model, spec.parallel)
    for rel in ("iter_0000100/mp_rank_01/model_optim_rng.pt", "latest_checkpointed_iteration.txt"):
        victim = _fifo(tmp_path / "m" / rel)
        with pytest.raises(CheckpointFormatError, match=rf"{victim}: is a fifo, not a regular file"):
            read_megatron(tmp_path / "m")
    write_dcp(*sharded_state(), tmp_path / "d")
    for name in ("__2_0.distcp", ".metadata"):
        victim = _fifo(tmp_path / "d" / name)
        with pytest.raises(DcpError, match=rf"{victim}: is a fifo, not a regular file"):
            read_dcp(tmp_path / "d")


def test_layout_file_that_is_a_fifo_is_refused(tmp_path):
    from tenplex.frameworks.dtensor.boxes import PlacementError
    from tenplex.frameworks.dtensor.mesh import MeshLayout

    fifo = tmp_path / "layout.json"
    os.mkfifo(fifo)
    with pytest.raises(PlacementError, match=rf"{fifo}: is a fifo, not a regular file"):
        MeshLayout.from_json(str(fifo))
