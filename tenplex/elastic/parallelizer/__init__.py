"""The parallelizer: which (tp, pp, dp) a job should run with on a given number of devices.

`choose` enumerates and picks (`choose`), `cost` predicts step time and memory of one layout,
`choice` is the answer and its explanation in words.
"""

from tenplex.elastic.parallelizer.choice import Choice, describe
from tenplex.elastic.parallelizer.choose import NoFitError, TableEntryError, choose
from tenplex.elastic.parallelizer.cost import Candidate, Hardware, Workload

__all__ = ["Candidate", "Choice", "Hardware", "NoFitError", "TableEntryError", "Workload", "choose", "describe"]
