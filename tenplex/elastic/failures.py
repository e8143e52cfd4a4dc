"""What the elastic controller does after a failure (`Controller` inherits it):

- an injected failure (`_recover`): rebuild from the survivors' save when it covers the state
  (`recovery: replicas`), else restart from the last checkpoint;
- an unplanned crash (`_restart`): the same layout from the last checkpoint, the state the
  generation started from;
- a lost host (`_without`, detected by its agent not answering): continue on the survivors from
  what their stores hold of the generation's start state, or from the job's start.
"""

from __future__ import annotations

from typing import Any

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.configs import choose_config
from tenplex.elastic.errors import ProgramFailed
from tenplex.elastic.job import Event
from tenplex.elastic.records import Reconfiguration


class FailureHandling:
    """Failure handling of `Controller` (its attributes: spec, cluster, mover, steps, out, and
    its `_reshard`)."""

    def _recover(self, generation: int, src: ParallelConfig, event: Event, timing: dict,
                 signal_time: float) -> Reconfiguration:  # fmt: skip
        """After an injected failure: the survivors' save if it covers the state (and the job
        asks for replicas), else the last checkpoint (see the module docstring)."""
        from tenplex.frameworks.dcp.format import DcpError
        from tenplex.ir.errors import CompileError

        survivors = src.world - len(event.fail)
        dst = choose_config(self.spec, event.devices or survivors, event.tp, event.pp)
        failure = {"failed": tuple(event.fail)}
        if self.spec.recovery == "replicas":
            held = self.mover.tensors("saved", generation) if self.mover.holds("saved", generation) else set()
            missing = [name for name in timing.get("tensors", []) if name not in held]
            try:
                if not missing:
                    return self._reshard(generation, src, dst, timing, signal_time, recovered_from="replicas", **failure)
            except (DcpError, CompileError) as e:  # a region of a tensor no survivor held
                missing = [str(e)]
            self.out(f"generation {generation}: the survivors do not hold the whole state ({missing[0]}...); "
                     "restarting from the last checkpoint")  # fmt: skip
        start = min((step for step, _ in self.steps.records(generation)), default=int(timing["stop_step"]))
        return self._reshard(generation, src, dst, timing, signal_time, "state", recovered_from="checkpoint",
                             lost_steps=int(timing["stop_step"]) - start, **failure)  # fmt: skip

    def _restart(self, generation: int, config: ParallelConfig, failure: ProgramFailed, dst: ParallelConfig | None = None,
                 source: str = "state", **failed: Any) -> Reconfiguration:  # fmt: skip
        """After an unplanned crash: `dst` (default the same layout) from the last checkpoint, the
        state generation N started from (in the stores: on the surviving hosts); the steps since lost."""
        steps = [step for step, _ in self.steps.records(generation)]
        crashed_at = max(steps) + 1 if steps else 0
        timing = {"stop": failure.exited, "save_end": failure.exited, "exit": failure.exited, "stop_step": crashed_at}
        lost = crashed_at if source == "start" else crashed_at - min(steps, default=crashed_at)
        return self._reshard(generation, config, dst or config, timing, failure.exited, source, recovered_from="checkpoint",
                             lost_steps=lost, **failed)  # fmt: skip

    def _without(self, generation: int, config: ParallelConfig, failure: ProgramFailed, lost: list[str]) -> Reconfiguration:
        """Hosts `lost` (agent and ranks) are gone: continue on the survivors, in a layout chosen for
        them, from what generation N started from as the survivors' stores hold it; from the job's
        start when they do not hold all of it (the stores keep no older checkpoint), saying so."""
        from tenplex.elastic.recovery import RecoveryError
        from tenplex.ir.errors import CompileError

        ranks = [r for r, h in self.cluster.hosts_of_ranks(config.world).items() if h in lost]
        self.cluster = self.cluster.without(lost)
        self.mover.forget_hosts(lost)
        devices = min(config.world, len(self.cluster.nodes) * self.cluster.per_node)  # idle survivors join in
        dst = choose_config(self.spec, devices)
        self.out(f"generation {generation}: host(s) {', '.join(lost)} lost with rank(s) {ranks}; "
                 f"continuing on {devices} process(es) from the survivors' stores")  # fmt: skip
        try:
            return self._restart(generation, config, failure, dst, failed=tuple(ranks))
        except (RecoveryError, CompileError) as e:
            self.out(f"generation {generation}: the survivors do not hold the whole state ({str(e)[:200]}); "
                     "restarting the job from its start")  # fmt: skip
            return self._restart(generation, config, failure, dst, source="start", failed=tuple(ranks))
