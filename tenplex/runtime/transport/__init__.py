"""How bytes travel between processes: `ucx/` (UCX over shared memory on one node, TCP between
nodes, CUDA transports where a GPU is present) and `local` (in-process, for the executor and tests)."""
