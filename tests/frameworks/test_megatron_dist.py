"""Megatron `torch_dist` checkpoints against megatron-core itself, in gloo CPU ranks.

megatron-core saves a GPT model (SwiGLU, GQA, untied output layer) with Adam state under
tp=2,pp=1 (`fixtures.megatron_dist`). tenplex reshards it into other layouts; megatron-core's
`dist_checkpointing.load` under the target layout must restore, bit for bit, what it restores
from the original (its own load-time reshard) and what was saved. The target's chunks must be
the ones megatron-core writes when it saves under that layout itself. The same for megatron-core's
DistributedOptimizer, saved `fully_reshardable` (moved across tp and pp) and `dp_reshardable`
(moved across dp; a tp change refused).
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("megatron.core") is None:  # not imported here: fixtures.megatron_dist imports it with care
    pytest.skip("megatron-core (a peer package) is not installed", allow_module_level=True)
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from click.testing import CliRunner  # noqa: E402

from fixtures.megatron_dist.dumps import region, whole  # noqa: E402
from fixtures.megatron_dist.gpt import ITERATION, Job, load, save  # noqa: E402
from tenplex.cli.app import cli  # noqa: E402
from tenplex.frameworks.formats import detect, inspect  # noqa: E402
from tenplex.frameworks.megatron.tree import CheckpointFormatError  # noqa: E402
from tenplex.frameworks.megatron_dist.files import read_common  # noqa: E402
from tenplex.frameworks.megatron_dist.reshard import reshard_megatron_dist  # noqa: E402
from tests.frameworks.test_dcp_pickled import same_as_torch  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]

STEP = f"iter_{ITERATION:07d}"
SRC = Job(tp=2, pp=1)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("mdist") / "src"
    return root, save(root, SRC)


def test_megatron_leaves_the_torch_safe_globals_of_this_process_as_they_were(src):
    assert "megatron" in sys.modules  # the fixture imported it
    assert not [g for g in torch.serialization.get_safe_globals() if getattr(g, "__module__", "").startswith("megatron")]


def _chunks(step: Path) -> dict[str, list]:
    md = pickle.loads((step / ".metadata").read_bytes())
    return {k: sorted((tuple(c.offsets), tuple(c.sizes)) for c in v.chunks)
            for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")}  # fmt: skip


def _same(a: list, b: list) -> int:
    n = 0
    for dump_a, dump_b in zip(a, b, strict=True):
        assert [(k, o) for k, o, _ in dump_a] == [(k, o) for k, o, _ in dump_b]
        for (key, _, x), (_, _, y) in zip(dump_a, dump_b):
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), key
            n += 1
    return n


@pytest.mark.parametrize("to", [Job(tp=1, pp=2), Job(tp=4, pp=1)], ids=["tp1pp2", "tp4pp1"])
def test_megatron_loads_the_reshard_as_its_own_reshard_of_the_original(src, tmp_path, to):
    root, saved = src
    out = tmp_path / "out"
    done = reshard_megatron_dist(root, f"tp={to.tp},pp={to.pp}", out)
    assert (done.src_layout.tp, done.dst_layout.tp, done.dst_layout.pp) == (2, to.tp, to.pp)
    assert sorted(p.name for p in (out / STEP).iterdir()) == sorted(
        [".metadata", "common.pt", "metadata.json", *(f"__{r}_0.distcp" for r in range(to.world))])
    assert (out / "latest_checkpointed_iteration.txt").read_text() == str(ITERATION)
    assert json.loads((out / STEP / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    args = read_common(out / STEP)["args"]
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.seed) == (to.tp, to.pp, SRC.seed)
    assert f"rng_state/shard_{to.pp - 1}.{to.tp - 1}_{to.pp}.{to.tp}" in pickle.loads((out / STEP / ".metadata").read_bytes()).state_dict_metadata

    ours, theirs = load(out / STEP, to), load(root / STEP, to)
    assert _same(ours, theirs) > 30  # model + exp_avg + exp_avg_sq of every parameter, on every rank
    full = whole(saved)
    for dump in ours:
        for key, offset, t in dump:
            assert torch.equal(region(full[key], offset, t).reshape(t.shape), t), key


def test_the_cut_is_megatrons_own_for_the_target(src, tmp_path):
    """tenplex's tp=1,pp=2 output is cut exactly as megatron-core cuts a tp=1,pp=2 save."""
    root, _ = src
    reshard_megatron_dist(root, "tp=1,pp=2", tmp_path / "out")
    native = tmp_path / "native"
    save(native, Job(tp=1, pp=2))
    assert _chunks(tmp_path / "out" / STEP) == _chunks(native / STEP)


def test_detect_inspect_and_the_cli(src, tmp_path):
    root, _ = src
    assert detect(root) == detect(root / STEP) == "megatron-dist"
    same_as_torch(root / STEP / ".metadata")  # megatron-core's save plans too, through dcp.pickled's stand-ins
    lines = inspect(str(root))
    assert lines[0].startswith(f"Megatron torch_dist checkpoint: Megatron-LM tree {root}, step {STEP}, iteration {ITERATION}")
    assert "saved under tp=2,pp=1,dp=1 (from common.pt args)" in lines
    assert lines[-1] == "Hugging Face: no --hf-arch map (args.normalization is 'LayerNorm')"  # the GPT of this fixture
    assert any("linear_fc1.weight float32[4, 128, 32]: cut 4 along axis 0, 4 along axis 1 (tensor parallel)" in x for x in lines)
    bare = tmp_path / "bare"
    shutil.copytree(root / STEP, bare)
    result = CliRunner().invoke(cli, ["reshard", str(bare), "--from", "megatron", "--to", "tp=1,pp=1", "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["src_format"], doc["out_format"], doc["verified"]) == ("megatron-dist", "megatron-dist", True)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    assert "saved under tp=1,pp=1,dp=1 (from common.pt args)" in inspect(str(tmp_path / "o"))


def test_the_distributed_optimizer_in_both_forms(tmp_path):
    """fully_reshardable moves across tp (and pp, as the model does); dp_reshardable across dp
    only, and a tp change is refused naming why. Either way Megatron loads tenplex's output as its own reshard."""
    full = Job(tp=2, optimizer="fully_reshardable")
    save(tmp_path / "fr", full)
    assert "model space (non-distributed optimizer or fully_reshardable)" in "\n".join(inspect(str(tmp_path / "fr")))
    reshard_megatron_dist(tmp_path / "fr", "tp=1", tmp_path / "fr2")
    to = Job(tp=1, optimizer="fully_reshardable")
    assert _same(load(tmp_path / "fr2" / STEP, to), load(tmp_path / "fr" / STEP, to)) > 100

    flat = Job(tp=1, dp=2, optimizer="dp_reshardable")
    save(tmp_path / "dp", flat)
    lines = inspect(str(tmp_path / "dp"))
    assert "dp_reshardable (flat bucket buffers): tenplex reshards it across dp only" in "\n".join(lines)
    assert "content metadata: distrib_optim_sharding_type='dp_reshardable'" in lines
    with pytest.raises(CheckpointFormatError, match=r"saved dp_reshardable .* cannot move from tp=1,pp=1 to tp=2,pp=1"):
        reshard_megatron_dist(tmp_path / "dp", "tp=2", tmp_path / "x")
    reshard_megatron_dist(tmp_path / "dp", "tp=1,dp=1", tmp_path / "dp1")
    to = Job(tp=1, dp=1, optimizer="dp_reshardable")
    assert _same(load(tmp_path / "dp1" / STEP, to), load(tmp_path / "dp" / STEP, to)) > 100
