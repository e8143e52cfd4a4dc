"""`tenplex layout DCP_DIR` (issue 13 item 7): the `tenplex.dtensor-layout/1` document of the
layout a DCP checkpoint has now (`source_layout`), edited (the mesh) and given to
`tenplex reshard --to`; DCP's own loader reads the result. Unchanged, the layout reshards to the
same chunks."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tenplex.frameworks.dcp.read import ptc_of_index, read_dcp, read_index  # noqa: E402
from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.dtensor.mesh import MeshLayout, source_layout  # noqa: E402
from tests.frameworks.test_dcp_files import GLOBAL, VALUES, sharded_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def src_dir(tmp_path):
    """GLOBAL saved by 4 ranks of a 2x2 mesh (DCP's own FileSystemWriter, one file per rank)."""
    write_dcp(*sharded_state(), tmp_path / "a")
    return tmp_path / "a"


def _layout(tenplex, src_dir, *args) -> tuple[str, dict]:
    code, out, err = tenplex("layout", str(src_dir), *args)
    assert code == 0, err
    return out, (json.loads(out) if out else {})


def test_layout_of_a_sharded_checkpoint(src_dir, tenplex):
    text, doc = _layout(tenplex, src_dir)
    assert doc["format"] == "tenplex.dtensor-layout/1" and doc["mesh"] == [2, 2]
    assert doc["placements"] == {
        "model.b": ["S(0)", "R"],  # saved [R, S(0)]: DCP keeps no mesh dims, only where chunks are cut
        "model.e": ["S(0)", "R"],
        "model.tiny": ["S(0)", "R"],
        "model.w": ["S(0)", "S(1)"],
        "*": ["R", "R"],
    }
    assert '    "model.w": ["S(0)", "S(1)"],\n' in text  # one rule per line, to edit
    assert MeshLayout.from_json(text) == source_layout(ptc_of_index(read_index(src_dir)))


def _load_full(path) -> dict:
    sd = {f: torch.zeros(a.shape, dtype=getattr(torch, a.dtype.name)) for f, (a, _) in GLOBAL.items()}
    sd.update(dict.fromkeys(VALUES))
    dcp.load(sd, checkpoint_id=str(path), no_dist=True)
    return sd


@pytest.mark.parametrize("mesh", [[4, 1], [1, 3], [2, 2]], ids=["4x1", "1x3", "unchanged"])
def test_edited_layout_reshards_and_dcp_loads_it(src_dir, tenplex, tmp_path, mesh):
    _, doc = _layout(tenplex, src_dir, "-o", str(tmp_path / "layout.json"))
    assert doc == {} and (tmp_path / "layout.json").is_file()  # -o: nothing on stdout
    doc = json.loads((tmp_path / "layout.json").read_text())
    doc["mesh"] = mesh
    (tmp_path / "layout.json").write_text(json.dumps(doc))
    code, out, err = tenplex("reshard", str(src_dir), "--to", str(tmp_path / "layout.json"), "--out", str(tmp_path / "b"))
    assert code == 0, err
    ptc, _, _ = read_dcp(tmp_path / "b")
    assert len(ptc.partitions) == int(np.prod(mesh))
    got = _load_full(tmp_path / "b")
    for fqn, (want, _) in GLOBAL.items():
        assert got[fqn].view(-1).view(torch.uint8).numpy().tobytes() == want.tobytes(), fqn
    assert got["step"] == VALUES["step"]
    if mesh == [2, 2]:  # as printed: the same chunks, where one mesh dim cut one tensor dim ([S(0), S(0)] is not that)
        def chunks(path):
            index = read_index(path)
            return sorted((e.fqn, e.box.start, e.box.stop) for e in index.entries
                          if e.box is not None and e.box.volume and e.fqn in ("model.w", "model.b"))  # fmt: skip

        assert chunks(tmp_path / "b") == chunks(src_dir)


def test_layout_of_a_single_process_save_is_one_rank(tmp_path, tenplex):
    dcp.save({"w": torch.ones(3, 2), "step": 3}, checkpoint_id=str(tmp_path / "one"), no_dist=True)
    _, doc = _layout(tenplex, tmp_path / "one")
    assert doc == {"format": "tenplex.dtensor-layout/1", "mesh": [1], "placements": {"*": ["R"]}}


def test_layout_needs_a_dcp_checkpoint(tmp_path, tenplex):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "ptc.json").write_text("{}")
    code, out, err = tenplex("layout", str(tmp_path / "t"))
    assert code == 2 and out == "" and "a tenplex checkpoint, not DCP" in err and err.count("\n") == 1
    code, out, err = tenplex("layout", str(tmp_path / "none"))
    assert code == 2 and "not a directory" in err
