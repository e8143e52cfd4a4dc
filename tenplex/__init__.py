"""tenplex: reconfigure the state of multi-dimensional parallel training jobs.

The public API at the top: PTCs (`PTC`, `load_ptc`, `ptc_from_spec`), the plan compiler
(`compile_plan`, `CompileOptions`, `Plan`) and its checker (`check_plan`), and `save`/`load` of
nested training state (torch tensors, numpy arrays, scalars) as a tree of `.npy` files. Plans
run on agents through `tenplex.runtime.Runtime`; checkpoints of training frameworks are read and
written by `tenplex.frameworks`; elastic jobs are `tenplex.elastic`. The map of the packages:
docs/architecture.md. `__version__`: the installed package's version, or pyproject.toml's in a
source checkout that was never installed.
"""

from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, dumps_plan, load_plan
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir import PTC, TenplexError, dumps, load_ptc, save_ptc
from tenplex.runtime.checkpoint import SerdeError, load, save


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tenplex")
    except PackageNotFoundError:  # a source checkout on sys.path, never installed
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _version()
__all__ = [
    "__version__", "PTC", "CompileOptions", "Plan", "SerdeError", "TenplexError", "check_plan", "compile_plan", "dumps",
    "dumps_plan", "load", "load_plan", "load_ptc", "ptc_from_spec", "save", "save_ptc",
]  # fmt: skip
