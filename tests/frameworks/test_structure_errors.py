"""A structure directory that is malformed or disagrees with its layout raises StructureError
naming the file and the key path; one named case per message."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.megatron.tree import build_tree
from tenplex.frameworks.structure.files import StructureError
from tenplex.frameworks.structure.read import inspect_structure, read_structure, write_structure
from tenplex.frontends.spec import parse_spec
from tenplex.ir.errors import TenplexError

R0, R1, R3 = "rank00/mp_rank_00_000.json", "rank01/mp_rank_01_000.json", "rank03/mp_rank_01_001.json"
ENC = ("model", "language_model", "encoder")
QKV = "layers.0.self_attention.query_key_value.weight"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_structure(parse_spec("gpt-tiny:tp2,pp2,dtype=float16@1x4").build(), tmp_path_factory.mktemp("s") / "s")


def edit(rel: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        doc = json.loads((root / rel).read_text())
        change(doc)
        (root / rel).write_text(json.dumps(doc))

    return apply


def at(doc: dict, *path) -> dict:
    for key in path:
        doc = doc[key]
    return doc


def _set(path: tuple, value) -> Callable[[dict], None]:
    return lambda doc: at(doc, *path[:-1]).__setitem__(path[-1], value)


def _drop(path: tuple) -> Callable[[dict], None]:
    return lambda doc: at(doc, *path[:-1]).pop(path[-1])


OPT = ("optimizer", "optimizer")
CASES = {  # name: (mutation of the directory, file named, key named)
    "missing_rank_file": (lambda r: (r / R3).unlink(), R3, "missing (rank 3: pp=1, mp=1, dp=0)"),
    "wrong_file_name": (
        lambda r: (r / R0).rename(r / "rank00/mp_rank_00.json"),
        "rank00/mp_rank_00.json",
        "with pp=2 it is mp_rank_00_000.json",
    ),
    "extra_rank_dir": (lambda r: shutil.copytree(r / "rank00", r / "rank04"), "rank04", "beyond 4 ranks"),
    "malformed_json": (lambda r: (r / R1).write_text('{"model": '), R1, "not valid JSON"),
    "wrong_model_shape": (
        edit(R3, _set((*ENC, QKV), {"tensor": [48, 64]})),
        R3,
        f"key 'model/language_model/encoder/{QKV}' has shape [48, 64], expected [96, 64]",
    ),
    "malformed_tensor": (edit(R3, _set((*ENC, QKV), {"tensor": "96x64"})), R3, f"{QKV}' is"),
    "missing_parameter": (
        edit(R1, _drop((*ENC, "layers.1.mlp.dense_4h_to_h.bias"))),
        R1,
        "key 'model/language_model/encoder/layers.1.mlp.dense_4h_to_h.bias' missing",
    ),
    "unknown_model_key": (
        edit(R1, _set((*ENC, "layers.0.adapter.weight"), {"tensor": [4]})),
        R1,
        "unknown key 'model/language_model/encoder/layers.0.adapter.weight'",
    ),
    "unknown_top_tensor": (edit(R1, _set(("extra",), {"tensor": [2]})), R1, "unknown key 'extra'"),
    "wrong_exp_avg_shape": (
        edit(R3, _set((*OPT, "state", "2", "exp_avg"), {"tensor": [64, 64]})),
        R3,
        "key 'optimizer/optimizer/state/2/exp_avg' has shape [64, 64], expected [128, 64]",
    ),
    "missing_exp_avg_sq": (
        edit(R3, _drop((*OPT, "state", "5", "exp_avg_sq"))),
        R3,
        "key 'optimizer/optimizer/state/5/exp_avg_sq' missing",
    ),
    "unknown_state_index": (
        edit(R3, _set((*OPT, "state", "99"), {})),
        R3,
        "unknown key 'optimizer/optimizer/state/99'",
    ),
    "unknown_state_entry": (
        edit(R3, _set((*OPT, "state", "0", "max_exp_avg_sq"), {"tensor": [1]})),
        R3,
        "unknown key 'optimizer/optimizer/state/0/max_exp_avg_sq'",
    ),
    "wrong_master_shape": (
        edit(R3, _set(("optimizer", "fp32_from_fp16_params", 1, 0), {"tensor": [65]})),
        R3,
        "key 'optimizer/fp32_from_fp16_params/1/0' has shape [65], expected [64]",
    ),
    "missing_masters": (
        edit(R1, _drop(("optimizer", "fp32_from_fp16_params"))),
        R1,
        "key 'optimizer/fp32_from_fp16_params' missing",
    ),
    "group_size": (
        edit(R3, lambda d: at(d, *OPT, "param_groups", 0, "params").pop()),
        R3,
        "key 'optimizer/optimizer/param_groups/0/params' lists 8 parameters, but the stage has 9",
    ),
    "distributed_optimizer": (
        edit(R0, _drop((*OPT, "param_groups", 1, "params"))),
        R0,
        "key 'optimizer/optimizer/param_groups/1' has no 'params'",
    ),
    "iteration_differs": (edit(R3, _set(("iteration",), 7)), R3, "key 'iteration' is 7"),
    "bert_key": (edit(R3, _set(("model", "lm_head"), {"bias": {"tensor": [512]}})), R3, "key 'model/lm_head/bias'"),
    "measure_key_missing": (
        edit(R0, _drop((*ENC, "layers.0.input_layernorm.weight"))),
        R0,
        "key 'model/language_model/encoder/layers.0.input_layernorm.weight' missing (needed to measure",
    ),
    "qkv_fits_no_layout": (
        edit(R0, _set((*ENC, QKV), {"tensor": [32, 64]})),
        R0,
        "QKV rows 32 x tp=2 and dense columns 32 x tp fit no (np + 2·ng)·hn layout",
    ),
    "fc1_rows": (
        edit(R0, _set((*ENC, "layers.0.mlp.dense_h_to_4h.weight"), {"tensor": [100, 64]})),
        R0,
        "layer 0 fc1 rows 100 are neither fc2 columns 128 nor twice that",
    ),
    "layer_gap": (
        edit(R0, lambda d: at(d, *ENC).update({"layers.5.input_layernorm.weight": {"tensor": [64]}})),
        R0,
        "key 'model' holds layers [0, 1, 5], expected 0..2",
    ),
    "rank_map_not_json": (lambda r: (r / "rank_map.json").write_text("{0: 1}"), "rank_map.json", "not valid JSON"),
    "rank_map_missing_rank": (edit("rank_map.json", _drop(("3",))), "rank_map.json", "3 ranks, but"),
    "rank_map_order": (
        edit("rank_map.json", lambda d: d.update({"1": d["2"], "2": d["1"]})),
        "rank_map.json",
        "key '1' is (pp=1, mp=0, dp=0), which Megatron's order",
    ),
    "rank_map_entry": (edit("rank_map.json", _set(("2",), {"pp_rank": 1})), "rank_map.json", "key '2'"),
    "rank_map_key": (edit("rank_map.json", lambda d: d.update({"x": d.pop("3")})), "rank_map.json", "key 'x'"),
    "model_keys_missing": (lambda r: (r / "model_keys.json").unlink(), "model_keys.json", "missing"),
    "model_keys_rank": (edit("model_keys.json", _drop(("2",))), "model_keys.json", "key '2' missing"),
    "model_keys_order": (edit("model_keys.json", lambda d: d["1"].reverse()), "model_keys.json", "key '1/0' is"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_structure_names_file_and_key(name, pristine, tmp_path):
    change, file, key = CASES[name]
    root = tmp_path / "s"
    shutil.copytree(pristine, root)
    change(root)
    with pytest.raises(StructureError) as e:
        read_structure(root)
    assert str(root / file) in str(e.value) and key in str(e.value), str(e.value)
    assert isinstance(e.value, TenplexError)
    with pytest.raises(StructureError) as inspected:  # a structure that does not read is an error, not a finding
        inspect_structure(root)
    assert str(inspected.value) == str(e.value)


def test_directory_name_must_agree_with_the_rank_map(pristine, tmp_path):
    root = tmp_path / "megatron-lm" / "fp16" / "gpt" / "tiny" / "pp02" / "mp04" / "dp01"
    shutil.copytree(pristine, root)
    with pytest.raises(StructureError, match="the directory names tp=4, pp=2, dp=1, but rank_map.json numbers tp=2"):
        read_structure(root)


def test_precision_given_must_agree_with_the_optimizer(pristine):
    with pytest.raises(StructureError, match=r"mp_rank_00_000.json: key 'optimizer' shows fp16 .* dtype= says fp32"):
        read_structure(pristine, dtype="fp32")


def test_vocab_must_pad_to_the_embedding_rows(pristine):
    with pytest.raises(
        StructureError, match=r"word_embeddings/weight' has 512 rows x tp=2 = 1024, but vocab=2000 pads"
    ):
        read_structure(pristine, vocab=2000)


def test_heads_must_fit_the_widths(pristine):
    with pytest.raises(StructureError, match=r"mp_rank_00_000.json: heads=3 does not divide the Q width 64"):
        read_structure(pristine, heads=3)


def test_writing_refuses_an_existing_directory(pristine):
    with pytest.raises(StructureError, match="already exists"):
        write_structure(parse_spec("gpt-tiny:tp2,pp2@1x4").build(), pristine)


def test_writing_refuses_the_distributed_optimizer(tmp_path):
    spec = parse_spec("gpt-tiny:tp2,pp1,dp2,zero1@1x4")
    with pytest.raises(StructureError, match="partition 'pp0-tp0-dp0': structures describe only"):
        write_structure(spec.build(), tmp_path / "a")
    build_tree(tmp_path / "ckpt", spec.model, spec.parallel)
    with pytest.raises(StructureError, match=r"mp_rank_00/model_optim_rng.pt: key 'args' asks for the distributed"):
        write_structure(tmp_path / "ckpt", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_uneven_middle_stages_are_refused(tmp_path):
    root = write_structure(parse_spec("gpt-tiny:tp1,pp4,dtype=float16@1x4").build(), tmp_path / "s")
    edit(
        "rank01/mp_rank_00_001.json",
        lambda d: at(d, *ENC).update({"layers.1.input_layernorm.weight": {"tensor": [64]}}),
    )(root)
    with pytest.raises(
        StructureError, match=r"rank00/mp_rank_00_000.json: stages hold \[1, 2, 1, 1\] layers: only the first"
    ):
        read_structure(root)


def test_a_dp_rank_1_directory_is_refused(tmp_path):
    root = write_structure(parse_spec("gpt-tiny:tp2,pp1,dp2,dtype=float16@1x4").build(), tmp_path / "s")
    shutil.copytree(root / "rank00", root / "rank02")
    with pytest.raises(StructureError, match=r"rank02: unexpected rank directory \(dp_rank 1 > 0: only dp_rank-0"):
        read_structure(root)


@pytest.mark.parametrize(("options", "message"), [
    ({"dtype": "int8"}, "dtype='int8' is not one of"),
    ({"tied": False}, "rank02/mp_rank_00_001.json: tied=False, but the last stage has no untied output_layer"),
])  # fmt: skip
def test_options_that_contradict_the_files(options, message, pristine):
    with pytest.raises(StructureError, match=re.escape(message)):
        read_structure(pristine, **options)
