"""`make demo` (`python -m demo`): tenplex end to end on this machine, part by part.

`paper`, `steps`, `agents`, `hosts` and `elastic` each run and show one part; `main` runs them in
order, each part's title printed before it runs, and prints the summary (`headline`) last. `hosts` and `convergence` are also what `bench/` and
`experiments/` measure with. Not part of the installed library.
"""

from demo.agents import AgentStep, run_agent_steps
from demo.main import headline, main
from demo.paper import Case, run_case
from demo.printer import Printer
from demo.steps import Step, run_steps

__all__ = ["AgentStep", "Case", "Printer", "Step", "headline", "main", "run_agent_steps", "run_case", "run_steps"]
