"""`dcp.pickled`'s stand-ins against the installed torch: the same names, fields, defaults and enum
values, and a `.metadata` unpickled through them (`dcp.metadata.load_metadata`) holds what
unpickling it with torch gives, field by field (`same_as_torch`, also applied to the zstd and
megatron-core `torch_dist` fixtures in their own test files). Reading an index imports no torch."""

import dataclasses
import enum
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint.metadata as torch_metadata  # noqa: E402
import torch.distributed.checkpoint.planner as torch_planner  # noqa: E402
from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402

from tenplex.frameworks.dcp import pickled  # noqa: E402
from tenplex.frameworks.dcp.metadata import load_metadata  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


def plain(x):
    """`x` as builtins, for comparing a torch-unpickled metadata with a stand-in one."""
    if isinstance(x, (*_TORCH_VALUES, pickled.TorchName)):
        return ("torch value", str(x))
    if isinstance(x, enum.Enum):
        return ("enum", type(x).__name__, x.name, x.value)
    if isinstance(x, (torch.Size, pickled.Size)):
        return ("size", *x)
    if dataclasses.is_dataclass(x):
        return (type(x).__name__, sorted((k, plain(v)) for k, v in vars(x).items()))
    if isinstance(x, dict):
        return ("dict", sorted((repr(plain(k)), plain(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [plain(v) for v in x]
        return (type(x).__name__, sorted(items, key=repr) if isinstance(x, (set, frozenset)) else items)
    return x


def same_as_torch(path) -> None:
    """Asserts that `path` (a `.metadata` file) loads through the stand-ins as torch loads it."""
    with open(path, "rb") as f:
        theirs = pickle.load(f)  # noqa: S301 (a file this test suite wrote)
    ours = load_metadata(path)
    assert plain(ours) == plain(theirs)
    assert type(ours).__name__ == "Metadata" and type(ours).__module__ == pickled.__name__


def test_every_torch_dtype_layout_and_memory_format_and_only_those():
    assert {k: str(v) for k, v in vars(torch).items() if isinstance(v, _TORCH_VALUES)} == pickled.TORCH_NAMES
    assert {str(v) for v in vars(torch).values() if isinstance(v, torch.dtype)} == pickled.DTYPES


def test_the_classes_are_torchs_with_the_same_fields_and_values():
    ours = {(m, n): c for (m, n), c in pickled.CLASSES.items() if isinstance(c, type) and m != "torch"}
    theirs = {
        **{(torch_metadata.__name__, n): c for n, c in vars(torch_metadata).items()
           if isinstance(c, type) and c.__module__ == torch_metadata.__name__},
        **{(torch_planner.__name__, n): getattr(torch_planner, n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData")},
        (_StorageInfo.__module__, "_StorageInfo"): _StorageInfo,
    }  # fmt: skip
    assert ours.keys() == theirs.keys()
    for key, cls in ours.items():
        if issubclass(cls, enum.Enum):
            assert [(m.name, m.value) for m in cls] == [(m.name, m.value) for m in theirs[key]], key
        else:
            fields = [[(f.name, plain(f.default), _made(f.default_factory), f.hash, f.compare) for f in dataclasses.fields(c)]
                      for c in (cls, theirs[key])]  # fmt: skip
            assert fields[0] == fields[1], key


def _made(factory):
    return None if factory is dataclasses.MISSING else plain(factory())


def test_a_dcp_save_loads_as_torch_loads_it(tmp_path):
    state = {"model": {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "b": torch.ones(2, dtype=torch.int64)},
             "step": 5, "ids": [1, 2]}  # fmt: skip
    dcp.save(state, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    same_as_torch(tmp_path / "ck" / ".metadata")
    assert plain(pickled.MetadataIndex("w", [1, 2])) == plain(torch_metadata.MetadataIndex("w", [1, 2]))
    assert hash(pickled.MetadataIndex("w", [1, 2], index=3)) == hash(torch_metadata.MetadataIndex("w", [1, 2]))
    for ours, theirs in [(pickled.Size([3, -1]), torch.Size([3, -1])), (pickled.torch_value("half"), torch.half),
                         (pickled.get_layout("torch.strided"), torch.strided)]:  # fmt: skip
        assert (repr(ours), str(ours)) == (repr(theirs), str(theirs))  # error messages quote them


def test_reading_an_index_imports_no_torch(tmp_path):
    dcp.save({"w": torch.ones(2, 3)}, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    code = ("import sys; from tenplex.frameworks.formats import inspect; from tenplex.cli.layout import layout_cmd; "
            f"lines = inspect({str(tmp_path / 'ck')!r}); assert 'torch' not in sys.modules, lines; print(lines[1])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("tensor w: float32[2, 3], 1 chunk(s) in 1 file(s)")
