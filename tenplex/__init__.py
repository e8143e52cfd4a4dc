"""tenplex: reconfigure the state of multi-dimensional parallel training jobs.

The public API of the foundation: PTCs (`PTC`, `load_ptc`, `ptc_from_spec`), the plan compiler
(`compile_plan`, `CompileOptions`, `Plan`) and its checker (`check_plan`), and `save`/`load` of
nested training state (torch tensors, numpy arrays, scalars) as a tree of `.npy` files. The
runtime's `Runtime` comes with the runtime issue.
"""

from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, dumps_plan, load_plan
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir import PTC, TenplexError, dumps, load_ptc, save_ptc
from tenplex.runtime.checkpoint import SerdeError, load, save

__all__ = [
    "PTC", "CompileOptions", "Plan", "SerdeError", "TenplexError", "check_plan", "compile_plan", "dumps",
    "dumps_plan", "load", "load_plan", "load_ptc", "ptc_from_spec", "save", "save_ptc",
]  # fmt: skip
