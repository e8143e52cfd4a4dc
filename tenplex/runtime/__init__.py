"""The runtime: interprets verified plans on real bytes; never makes a planning decision.

- `runtime.Runtime`: drives one agent per host through a plan and commits atomically;
  `agent/`: the agent process (store, UCX worker, its share of a plan) and the runtime's handles;
- `store/`: a host's in-memory `TensorStore`; `checkpoint/`: state on disk (`tenplex.save`/`load`,
  checkpoint directories); `reshard`: offline resharding of a checkpoint directory;
- `transport/`: UCX between processes and hosts, and an in-process transport;
- `fuse/`: stores and dataset views as directories; `rest/`: the paper's REST API; `shm/`: a
  host's store shared with the training programs of its machine (shared memory);
- `executor` and `oracle`: plans executed in-process and checked against `arange` sources;
  `arrays`: numpy views of sub-tensors; `netns`: emulated hosts (network namespaces).

Names resolve lazily, so importing the package imports nothing heavy.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {
    "Runtime": "runtime", "Clock": "runtime", "TensorStore": "store", "StoreError": "store", "save": "checkpoint",
    "load": "checkpoint", "read_checkpoint": "checkpoint", "write_checkpoint_dir": "checkpoint", "reshard": "reshard",
    "AgentFleet": "agent", "check_execution": "oracle", "EmulatedHosts": "netns",
})  # fmt: skip
