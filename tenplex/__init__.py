"""tenplex: reconfigure the state of multi-dimensional parallel training jobs.

The public API at the top: PTCs (`PTC`, `load_ptc`, `ptc_from_spec`), the plan compiler
(`compile_plan`, `CompileOptions`, `Plan`) and its checker (`check_plan`), and `save`/`load` of
nested training state (torch tensors, numpy arrays, scalars) as a tree of `.npy` files. Plans
run on agents through `tenplex.runtime.Runtime`; checkpoints of training frameworks are read and
written by `tenplex.frameworks`; elastic jobs are `tenplex.elastic`. The map of the packages:
docs/architecture.md. `__version__`: the installed package's version, or pyproject.toml's in a
source checkout that was never installed.

Names resolve lazily (`tenplex._lazy`), so `import tenplex` — and the `tenplex` command's start,
which only needs `__version__` for `--version` — imports neither the compiler nor numpy;
`__version__` itself is looked up on first use (importlib.metadata).
"""

from tenplex._lazy import lazy

_exported, _names = lazy(__name__, {
    "CompileOptions": "compiler", "Plan": "compiler", "check_plan": "compiler", "compile_plan": "compiler",
    "dumps_plan": "compiler", "load_plan": "compiler", "ptc_from_spec": "frontends.spec", "PTC": "ir",
    "TenplexError": "ir", "dumps": "ir", "load_ptc": "ir", "save_ptc": "ir", "SerdeError": "runtime.checkpoint",
    "load": "runtime.checkpoint", "save": "runtime.checkpoint",
})  # fmt: skip


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


def __getattr__(name: str) -> object:
    if name == "__version__":  # computed on first use: importlib.metadata costs every command's start ~40 ms
        globals()["__version__"] = found = _version()
        return found
    return _exported(name)


__all__ = ["__version__", *_names]
