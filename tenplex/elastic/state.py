"""Where a generation's training state goes between generations: the hosts' tenplex stores (the
default) or DCP files in the job directory (`state: files` in the job file, one host only).

With the store, the controller starts an agent with a local socket on every host (`state_home`)
and passes each host's ranks their agent's socket (TENPLEX_STORE, with TENPLEX_JOB_NAME and
TENPLEX_JOB_ID); generation N saves with DCP into tag `saved-N` (`frameworks.dcp.storage.
StoreWriter`; one rank per host completes its host's part), the controller moves that tag peer
to peer into generation N + 1's layout and hosts as `state-<N+1>` (`reshard_stored`, optionally
with store replicas on the next hosts), committing the data state with it on every host, and
generation N + 1 loads both from its host's store (`StoreReader`). No checkpoint file is
written; the job's final state is written to `saved/gen-N/checkpoint` at the end (`persist`).
With files, generation N `dcp.save`s into `saved/gen-N` and the controller reshards the files into
`state/gen-<N+1>` (`reshard_dcp`), which the next generation loads (`load_dcp`).

Either way the controller's control files stay in the first host's job directory (`jobdir`): what
rank 0 writes (timings, `COMPLETE`, metrics, the declaration) and its own copies of the data
state; `state/gen-N/STORED` marks a generation whose state is the store tag `state-N`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.jobdir import saved_dir, state_dir

STORED = "STORED"  # state/gen-N/STORED: generation N's state is the store tag state-N


def saved_tag(generation: int) -> str:
    return f"saved-{generation}"


def state_tag(generation: int) -> str:
    return f"state-{generation}"


@attrs.frozen
class StateHome:
    """The store of this job's host (`store`: its local socket), or None: DCP files."""

    store: str | None = None
    name: str = "job"  # the job's name in the store (/job/<name>/...)
    job_id: str | None = None  # marks the state as this job's: a store holding another's is refused

    @classmethod
    def from_env(cls, env: dict[str, str]) -> StateHome:
        return cls(env.get("TENPLEX_STORE") or None, env.get("TENPLEX_JOB_NAME") or "job", env.get("TENPLEX_JOB_ID") or None)

    def env(self) -> dict[str, str]:
        return {} if self.store is None else {"TENPLEX_STORE": self.store, "TENPLEX_JOB_NAME": self.name,
                                              "TENPLEX_JOB_ID": self.job_id or ""}  # fmt: skip

    def resuming(self, job_dir: Path, generation: int) -> bool:
        """True when generation `generation` has a state to load (see the module docstring)."""
        if self.store is None:
            return (state_dir(job_dir, generation) / ".metadata").exists()
        return self.record(generation, "dcp") is not None

    def record(self, generation: int, name: str) -> Any:
        """With the store: the record `name` of generation `generation`'s state tag in this host's
        store (`dcp`, `data_state`, ...), or None; without: None."""
        if self.store is None or generation == 0:
            return None
        from tenplex.runtime.shm.client import StoreClient
        from tenplex.runtime.store.layout import meta_path

        path = meta_path(self.name, state_tag(generation), name)
        with StoreClient(self.store) as client:
            return client.get([path])[path] if client.exists(path) else None

    def load(self, state_dict: dict[str, Any], job_dir: Path, generation: int, rank: int) -> None:
        """Fill `state_dict` in place from generation `generation`'s state."""
        if self.store is None:
            from tenplex.frameworks.dcp.load import load_dcp

            load_dcp(state_dict, state_dir(job_dir, generation), rank=rank)
            return
        import torch.distributed.checkpoint as dcp

        from tenplex.frameworks.dcp.storage import StoreReader

        try:
            dcp.load(state_dict, storage_reader=StoreReader(self.store, self.name, state_tag(generation), job_id=self.job_id))
        except BaseException as e:  # DCP wraps every rank's error in a CheckpointException (a BaseException)
            if type(e).__name__ != "CheckpointException":
                raise
            raise ElasticError(f"generation {generation}: loading its state from the store failed: {_first_line(e)}") from None

    def save(self, state_dict: dict[str, Any], job_dir: Path, generation: int, group: Any = None) -> None:
        """Save generation `generation`'s state with DCP (over `group`, default: every rank)."""
        import torch.distributed.checkpoint as dcp

        if self.store is None:
            dcp.save(state_dict, checkpoint_id=str(saved_dir(job_dir, generation)), process_group=group)
            return
        from tenplex.frameworks.dcp.storage import StoreWriter, complete_save

        writer = StoreWriter(self.store, self.name, saved_tag(generation), job_id=self.job_id, replace=True)
        metadata = dcp.save(state_dict, storage_writer=writer, process_group=group)
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one rank per host completes its host's part
            complete_save(writer.client, self.name, saved_tag(generation), metadata, replace=True)


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if "tenplex" in line or "Error:" in line]
    return (lines[-1] if lines else str(e).splitlines()[0]).strip()


def mark_stored(job_dir: Path, generation: int) -> Path:
    """Mark generation `generation`'s state as the store tag `state-N` (the controller, last)."""
    there = state_dir(job_dir, generation)
    there.mkdir(parents=True, exist_ok=True)
    (there / STORED).write_text(state_tag(generation) + "\n")
    return there
