"""Megatron `torch_dist` without megatron-core: the target cut (a property over random layouts),
detection of complete, half-written and unknown directories, and the refusals.

Synthetic checkpoints are written with tenplex's DCP writer plus `common.pt` and
`metadata.json`, cut the way megatron-core cuts (per layer, tp chunks, 2·tp for SwiGLU fc1).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tenplex.frameworks.dcp.write import write_dcp  # noqa: E402
from tenplex.frameworks.formats import FormatError, detect, inspect  # noqa: E402
from tenplex.frameworks.megatron.tree import CheckpointFormatError  # noqa: E402
from tenplex.frameworks.megatron_dist.layout import Layout, dst_ptc, grid  # noqa: E402
from tenplex.frameworks.megatron_dist.read import read_megatron_dist  # noqa: E402
from tenplex.frameworks.megatron_dist.reshard import reshard_megatron_dist  # noqa: E402
from tenplex.ir.box import Box  # noqa: E402
from tenplex.ir.ptc import PTC, Allocation, Partition  # noqa: E402
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta  # noqa: E402
from tenplex.ir.topology import Device, Topology  # noqa: E402

L, H = 4, 8
BUCKET = "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_0.exp_avg"


def _tensors(tp: int, glu: bool = True) -> dict[str, tuple[tuple[int, ...], list[int]]]:
    """name -> (global shape, parts per axis) as megatron-core saves a tp job."""
    fc1 = 2 * tp if glu else tp
    return {
        "embedding.word_embeddings.weight": ((64, H), [tp, 1]),
        "decoder.layers.self_attention.linear_qkv.weight": ((L, 16, H), [L, tp, 1]),
        "decoder.layers.self_attention.linear_proj.weight": ((L, H, H), [L, 1, tp]),
        "decoder.layers.mlp.linear_fc1.weight": ((L, 32, H), [L, fc1, 1]),
        "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight": ((L, 32, H), [L, fc1, 1]),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": ((L, H), [L, 1]),
        "decoder.final_layernorm.weight": ((H,), [1]),
        "output_layer.weight": ((64, H), [tp, 1]),
    }


def _ptc(tensors: dict, layout: Layout) -> tuple[PTC, dict]:
    """A one-partition-per-tensor PTC of the cut in `tensors`, with arange data."""
    metas, subs, parts, arrays = [], [], [], {}
    for name, (shape, n) in tensors.items():
        metas.append(TensorMeta(name, shape, "float32"))
        full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        spans = [[(i * s // k, (i + 1) * s // k) for i in range(k)] for s, k in zip(shape, n)]
        ids = []
        for cell in itertools.product(*spans):
            box = Box([a for a, _ in cell], [b for _, b in cell])
            sid = f"{name}@{list(box.start)}"
            subs.append(SubTensor(sid, name, sid, box.shape, (Piece(box, Box.from_shape(box.shape)),)))
            arrays[sid] = np.ascontiguousarray(full[tuple(slice(a, b) for a, b in cell)])
            ids.append(sid)
        parts.append(Partition(f"rank{len(parts)}", ids))
    ptc = PTC(tuple(metas), tuple(subs), tuple(parts), Allocation({p.id: (i,) for i, p in enumerate(parts)}),
              Topology(tuple(Device(i, "h0") for i in range(len(parts)))))  # fmt: skip
    return ptc, arrays


def _checkpoint(root: Path, tp: int, tensors: dict | None = None, tree: bool = True) -> Path:
    ptc, arrays = _ptc(tensors or _tensors(tp), Layout(tp, 1, 1))
    step = root / "iter_0000003" if tree else root
    write_dcp(ptc, arrays, {}, step)
    args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1, data_parallel_size=1, seed=5)
    torch.save({"args": args, "iteration": 3}, step / "common.pt")
    (step / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    if tree:
        (root / "latest_checkpointed_iteration.txt").write_text("3")
    return root


@settings(max_examples=40, deadline=None)
@given(src_tp=st.sampled_from([1, 2, 4]), dst=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
                                                          st.sampled_from([1, 2])), glu=st.booleans())  # fmt: skip
def test_the_target_cut_tiles_every_tensor_and_each_chunk_has_one_rank_of_its_stage(src_tp, dst, glu):
    src, _ = _ptc(_tensors(src_tp, glu), Layout(src_tp, 1, 1))
    dst_layout = Layout(*dst)
    out = dst_ptc(src, Layout(src_tp, 1, 1), dst_layout, {})
    assert not out.uncovered() and len(out.partitions) == dst_layout.world
    for meta in out.tensors:
        boxes = [p.global_box for s in out.by_tensor[meta.name] for p in s.pieces]
        cuts = grid(meta.name, meta.shape, boxes)  # a regular grid, disjoint (or grid() raises)
        want = {"linear_qkv.weight": [L, dst[0], 1], "linear_proj.weight": [L, 1, dst[0]],
                "linear_fc1.weight": [L, (2 if glu else 1) * dst[0], 1], "word_embeddings.weight": [dst[0], 1]}  # fmt: skip
        for suffix, parts in want.items():
            if meta.name.endswith(suffix):
                assert [len(c) - 1 for c in cuts] == parts, meta.name
    for part in out.partitions:
        r = int(part.id[4:])
        pp_rank = r // (dst_layout.tp * dst_layout.dp)
        for sid in part.subtensors:
            s = out.subtensor_map[sid]
            if s.tensor.startswith(("decoder.layers.", "optimizer.state.exp_avg.decoder.layers.")):
                assert s.pieces[0].global_box.start[0] * dst_layout.pp // L == pp_rank, sid
            if s.tensor == "output_layer.weight":
                assert pp_rank == dst_layout.pp - 1


def test_a_reshard_round_trip_gives_back_the_bytes(tmp_path):
    src = _checkpoint(tmp_path / "src", 2)
    reshard_megatron_dist(src, "tp=4,pp=2", tmp_path / "b")
    reshard_megatron_dist(tmp_path / "b", "tp=2,pp=1", tmp_path / "c")
    a, c = read_megatron_dist(src), read_megatron_dist(tmp_path / "c")
    assert c.layout == Layout(2, 1, 1) and a.ptc.tensors == c.ptc.tensors
    assert sorted(a.arrays) == sorted(c.arrays)
    for sid, arr in a.arrays.items():
        assert np.array_equal(arr, c.arrays[sid]), sid
    assert read_megatron_dist(tmp_path / "b").layout == Layout(4, 2, 1)


def test_half_written_and_unknown_directories_get_one_line_naming_what_is_missing(tmp_path):
    src = _checkpoint(tmp_path / "src", 2)
    step = src / "iter_0000003"
    (step / "metadata.json").unlink()
    assert detect(src) == detect(step) == "megatron-dist"
    with pytest.raises(CheckpointFormatError, match=r"missing metadata\.json \(megatron-core writes metadata\.json last"):
        inspect(str(src))
    (step / "common.pt").unlink()
    (step / ".metadata").unlink()
    with pytest.raises(CheckpointFormatError, match=r"missing metadata\.json, common\.pt, \.metadata$"):
        read_megatron_dist(src)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "notes.txt").write_text("x")
    with pytest.raises(FormatError, match="not a checkpoint tenplex reads") as e:
        detect(tmp_path / "odd")
    assert "\n" not in str(e.value)


def test_refusals_say_why(tmp_path):
    tensors = {**_tensors(2), BUCKET: ((256,), [2])}
    src = _checkpoint(tmp_path / "src", 2, tensors)
    assert "dp_reshardable" in "\n".join(inspect(str(src)))
    with pytest.raises(CheckpointFormatError, match=r"dp_reshardable .*cannot move from tp=2,pp=1 to tp=1,pp=1.*fully-reshardable"):
        reshard_megatron_dist(src, "tp=1,pp=1", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    reshard_megatron_dist(src, "tp=2,pp=1,dp=2", tmp_path / "b")  # dp alone: the buckets stay
    assert read_megatron_dist(tmp_path / "b").layout == Layout(2, 1, 2)
    with pytest.raises(CheckpointFormatError, match=r"linear_fc1.weight': dimension 1 of size 32 does not split into 6 equal parts for tp=3"):
        reshard_megatron_dist(_checkpoint(tmp_path / "s2", 1), "tp=3", tmp_path / "c")
    with pytest.raises(CheckpointFormatError, match=r"tp, pp and dp must be >= 1"):
        reshard_megatron_dist(src, "tp=0", tmp_path / "d")
    with pytest.raises(CheckpointFormatError, match=r"vpp not supported"):
        reshard_megatron_dist(src, "tp=1,vpp=2", tmp_path / "d")
