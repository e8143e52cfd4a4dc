"""The elastic controller: run a job's generations and reconfigure between them.

`Controller(spec, job_dir).run()` launches generation 0 on `spec.devices` processes and, for
each resource change (a schedule event or a `control/scale-*.json` request written by
`tenplex job scale`), carries out one reconfiguration:

1. choose the new (tp, pp, dp) (`configs.choose_config`); a request for the same layout is ignored;
2. stop: an `at_step` event is passed to the program up front (TENPLEX_STOP_STEP, exact and
   deterministic); `at_seconds` events and scale requests write `control/stop-N`;
3. wait for the program to save (`saved/gen-N/COMPLETE`) and exit;
4. reshard the saved state into the new layout, which the program's own declaration gives
   (`Job.declare`, saved as `parallel.json`; nothing here knows the model): with `state: store`
   (default) the agents move it peer to peer between their stores (`Runtime.execute`), with
   `state: files` tenplex reshards the DCP files (`state.Mover`); the data state goes beside it;
5. relaunch torchrun with the new W and generation N + 1.

A failure event (`{at_step: S, fail: [ranks]}`) is injected for real: those ranks crash at step S
(SIGKILL, no save) and torchrun tears the job down while the survivors save what they hold
(`api.Job.save`). Recovery (`spec.recovery`):
- `replicas` (default): rebuild the state from the survivors' save alone — DP replicas cover
  what the dead ranks held — when it covers every tensor the job had (the FQNs listed in
  `timing.json` and every region of each, which the DCP reader checks); no step is lost;
- otherwise, or with `recovery: checkpoint` (the baseline), restart from the last checkpoint:
  the state this generation started from (`state/gen-N`; at generation 0, the job's start), and
  re-run the lost steps.
Either way the next generation runs on the survivors (or the event's `devices`) with a layout
chosen for them. An unplanned crash (the program exits non-zero on its own) ends the job, unless
`spec.max_restarts` allows restarting it: then the same layout restarts from the last checkpoint.

Each reconfiguration records its phases in seconds: `stop` (request → the ranks agree to
stop), `save` (their checkpoint), `exit` (process teardown), `reshard` (with the store: `plan`,
reading the saved PTC and compiling and verifying the plan, + `move`, executing and committing
it) and `restart` (launch → first step of the new generation logged, its load included), plus `rerun` after a
restart from a checkpoint (first step → the lost steps done again). The report is written to
`JOB_DIR/report.json`; `JOB_DIR/status.json` says what the job is doing now.

Progress goes to `out`, one line per phase change (a generation starting, a stop, a reshard and
its bytes, a reconfiguration's phases): by default the logger `tenplex.elastic` at INFO, which
the `tenplex` command shows on stderr and a library caller configures (or not) as it likes.

Invariants:
- at most one generation runs at a time; its process tree is always ended (killed after
  `spec.timeout` seconds or on any error) and reaped;
- generation N + 1 starts only from a complete `saved/gen-N` (COMPLETE present), or after a
  failure from a checkpoint that is complete;
- a generation's non-zero exit is an error unless it is the injected failure and the survivors'
  save completed.

SIGTERM, SIGINT and SIGHUP reach the controller only (torchrun runs in a session of its own):
it ends the generation's process tree, reaps it and raises `signals.JobInterrupted`.

Before anything is created or started, `run` checks that the program is a file (`job.check_program`).

Raises ElasticError naming the generation, its exit code, the cause (the failing rank's exception,
`launch.failure_cause`) and log file, or a missing checkpoint; always one line.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tenplex.compiler.emit import human_bytes
from tenplex.elastic import launch as launcher
from tenplex.elastic.api import ParallelConfig, saved_dir, state_dir, stop_file
from tenplex.elastic.cluster import Cluster
from tenplex.elastic.configs import choose_config
from tenplex.elastic.errors import ElasticError, ProgramFailed
from tenplex.elastic.failures import FailureHandling
from tenplex.elastic.job import Event, JobSpec, check_program
from tenplex.elastic.moves import Mover, state_home
from tenplex.elastic.records import Reconfiguration, StepLog, describe_config, read_json, write_json
from tenplex.elastic.requests import take_scale_request
from tenplex.elastic.signals import JobInterrupted, raise_on_signals
from tenplex.elastic.state import StateHome

POLL = 0.05
log = logging.getLogger("tenplex.elastic")


class Controller(FailureHandling):
    """Runs one elastic job (see the module docstring); `out` takes the progress lines (default:
    `log.info`). The layouts come from the program's own declaration (`Job.declare`, saved with
    each generation's state as `parallel.json`): nothing here knows the model."""

    def __init__(self, spec: JobSpec, job_dir: str | Path, *, out: Callable[[str], None] = log.info,
                 cluster: Cluster | None = None) -> None:  # fmt: skip
        self.spec, self.job_dir, self.out = spec, Path(job_dir).resolve(), out
        self.cluster = cluster or Cluster.local(self.job_dir)  # `cluster`: the hosts, each its own directory
        self.pending = list(spec.schedule)
        self.reconfigurations: list[Reconfiguration] = []
        self.start = 0.0
        self.proc: subprocess.Popen | None = None  # the running generation's torchrun
        self.steps = StepLog(self.job_dir)
        self.home, self.mover = StateHome(), Mover(StateHome(), self.job_dir)  # set by `run` (`_state_home`)

    def run(self) -> list[Reconfiguration]:
        """Run every generation to the end; returns the reconfigurations (also in report.json).
        SIGTERM, SIGINT or SIGHUP end the running generation's process tree, then raise
        JobInterrupted (`signals`)."""
        check_program(self.spec)
        if saved_dir(self.job_dir, 0).exists():
            raise ElasticError(f"{self.job_dir}: the job directory was used before; give a fresh one")
        (self.job_dir / "control").mkdir(parents=True, exist_ok=True)
        self.start = time.time()
        self.current = 0, choose_config(self.spec, self.spec.devices)
        try:
            with raise_on_signals(), state_home(self.spec.state, self.job_dir, self.out, self.cluster) as self.mover:
                self.home = self.mover.home
                try:
                    self._generations()
                finally:  # end and reap the running generation's process tree, signals or not
                    launcher.terminate_surely(self.proc)
        except JobInterrupted as e:
            message = f"generation {self.current[0]}: {e}; torchrun and its workers were ended"
            self._status("failed", *self.current, error=message)
            raise JobInterrupted(e.signum, message) from None
        except BaseException as e:
            self._status("failed", *self.current, error=str(e))
            raise
        report = {"total_seconds": time.time() - self.start, "generations": self.current[0] + 1,
                  "reconfigurations": [r.to_json() for r in self.reconfigurations]}  # fmt: skip
        write_json(self.job_dir / "report.json", report, indent=1)
        self._status("done", *self.current)
        return self.reconfigurations

    def _generations(self) -> None:
        """Run generations from `self.current` until one finishes, keeping `current` up to date."""
        pending, restarts = None, 0
        while True:
            generation, config = self.current
            self.out(f"generation {generation}: {describe_config(config)}: {'re' if generation else ''}starting torchrun on "
                     f"{config.world} process{'es' * (config.world > 1)}; log {launcher.log_path(self.job_dir, generation)}")  # fmt: skip
            self._status("running", generation, config)
            try:
                event, signal_time, timing = self._run_generation(generation, config, pending)
            except ProgramFailed as e:
                if lost := self.mover.lost_hosts():  # a whole host is gone: go on without it
                    pending = self._without(generation, config, e, lost)
                    self.current = generation + 1, pending.dst
                    continue
                if restarts == self.spec.max_restarts:
                    raise
                restarts += 1
                self.out(f"{str(e).splitlines()[0]}: restart {restarts} of {self.spec.max_restarts} from the last checkpoint")
                pending = self._restart(generation, config, e)
                self.current = generation + 1, config
                continue
            if event is None:
                if (out := self.mover.persist(generation)) is not None:
                    self.out(f"generation {generation}: the final state, written from the store to {out}")
                return
            self._status("reconfiguring", generation, config)
            what = f"rank(s) {list(event.fail)} failed" if event.fail else "stopped and saved"
            self.out(f"generation {generation}: {what} at step {timing['stop_step']}")
            if event.fail:
                pending = self._recover(generation, config, event, timing, signal_time)
            else:
                dst = choose_config(self.spec, event.devices, event.tp, event.pp)
                pending = self._reshard(generation, config, dst, timing, signal_time)
            self.current = generation + 1, pending.dst

    def _status(self, state: str, generation: int, config: ParallelConfig, **extra: Any) -> None:
        doc = {"state": state, "generation": generation, "config": config.to_json(), "world": config.world,
               "reconfigurations": len(self.reconfigurations), "time": time.time(),
               "max_devices": self.spec.max_devices, **extra}  # fmt: skip
        write_json(self.job_dir / "status.json", doc)

    def _next_step_event(self) -> Event | None:
        return self.pending[0] if self.pending and self.pending[0].at_step is not None else None

    def _run_generation(self, generation: int, config: ParallelConfig,
                        pending: Reconfiguration | None) -> tuple[Event | None, float, dict]:  # fmt: skip
        """Run one generation to its exit. Returns the event that stopped it (None: it finished),
        when the stop was requested, and its saved timing. `pending` (the reconfiguration that
        led here) gets its restart phase once this generation logs its first step."""
        step_event = self._next_step_event()
        launched = time.time()
        proc = self.proc = launcher.launch(self.spec, self.job_dir, generation, config, step_event and step_event.at_step,
                               step_event.fail if step_event else (), self.home.env(), self.cluster, self.mover.node_env)  # fmt: skip
        requested: tuple[Event, float] | None = None
        try:
            while proc.poll() is None:
                if time.time() - launched > self.spec.timeout:
                    raise ElasticError(f"generation {generation}: still running after timeout={self.spec.timeout}s; "
                                       f"log {launcher.log_path(self.job_dir, generation)}")  # fmt: skip
                if requested is None:
                    requested = self._poll_request(generation, config)
                if pending is not None and self._finish(pending, generation, launched):
                    pending = None
                time.sleep(POLL)
        finally:
            launcher.terminate(proc)
        exited = time.time()
        saved = saved_dir(self.job_dir, generation)
        complete = (saved / "COMPLETE").exists()
        timing = {**read_json(saved / "timing.json"), "exit": exited} if complete else {}
        if pending is not None:
            self._finish(pending, generation, launched, final=True)
        if proc.returncode != 0 and "failed" not in timing:
            raise ProgramFailed(exited, launcher.failure_message(self.job_dir, generation, proc.returncode))
        if not complete:
            raise ElasticError(f"{saved}: generation {generation} exited without a complete checkpoint (no COMPLETE)")
        if "stop_step" not in timing:
            return None, 0.0, timing  # the program finished its steps
        if requested is not None:
            return (*requested, timing)
        times = [t for _, t in self.steps.records(generation)]  # an at_step stop: requested when the last step ended
        return self.pending.pop(0), max(times) if times else timing["stop"], timing

    def _poll_request(self, generation: int, config: ParallelConfig) -> tuple[Event, float] | None:
        """A due at_seconds event or scale request that changes the layout: request the stop."""
        event = None
        if self.pending and self.pending[0].at_seconds is not None and time.time() - self.start >= self.pending[0].at_seconds:
            event = self.pending.pop(0)
        if request := take_scale_request(self.job_dir, self.spec.max_devices, self.out):
            event = Event(request["devices"], tp=request["tp"])
        if event is None or choose_config(self.spec, event.devices, event.tp, event.pp) == config:
            return None
        stop_file(self.job_dir, generation).write_text(json.dumps({"devices": event.devices}))
        self.out(f"generation {generation}: stopping at its next step for {event.devices} device(s)")
        return event, time.time()

    def _reshard(self, generation: int, src: ParallelConfig, dst: ParallelConfig, timing: dict, signal_time: float,
                 source: str = "saved", **failure: Any) -> Reconfiguration:  # fmt: skip
        """Move generation N's `source` ("saved": its save; "state": what it started from) into
        N + 1's layout, with its data state; the reconfiguration so far. A source without a
        checkpoint, or "start": N + 1 starts afresh."""
        begin = time.time()
        out = state_dir(self.job_dir, generation + 1)
        where = {"saved": saved_dir(self.job_dir, generation), "state": state_dir(self.job_dir, generation)}.get(source)
        moved, phases = 0, {}
        if self.mover.holds(source, generation):
            how = "peer to peer between the agents' stores" if self.home.store else "DCP files"
            self.out(f"resharding generation {generation}'s {source} state from {describe_config(src)} to {describe_config(dst)} ({how})")
            data = read_json(where / "data_state.json") if (where / "data_state.json").exists() else None
            moved, phases = self.mover.move(source, generation, generation + 1, self.mover.layout(source, generation, dst),
                                            self.cluster.hosts_of_ranks(dst.world), {"data_state": data} if data else None,
                                            self.spec.store_replicas if self.cluster.multi else 0)  # fmt: skip
            self.out(f"resharded {human_bytes(moved)} in {time.time() - begin:.2f}s")
        out.mkdir(parents=True, exist_ok=True)  # without a checkpoint: a restart from the job's start
        for name in ("data_state.json", "parallel.json") if where else ():  # the controller's own copies (this host's)
            if (where / name).exists():
                shutil.copy(where / name, out / name)
        self.mover.forget(generation)
        phases = {"stop": max(0.0, timing["stop"] - signal_time), "save": timing["save_end"] - timing["stop"],
                  "exit": timing["exit"] - timing["save_end"], **phases}  # fmt: skip
        phases.setdefault("reshard", sum(v for k, v in phases.items() if k in ("plan", "move")))
        return Reconfiguration(int(timing["stop_step"]), src, dst, phases, moved, **failure)

    def _finish(self, rec: Reconfiguration, generation: int, launched: float, final: bool = False) -> bool:
        """Record `rec`'s restart (and rerun) phase once generation N + 1 logged its first step
        (and re-ran the lost steps); `final` (it exited): with what it logged. True when done."""
        records = self.steps.records(generation)
        caught_up = [t for step, t in records if step >= rec.step - 1]
        if not final and (not records or rec.lost_steps and not caught_up):
            return False
        first = min((t for _, t in records), default=time.time())
        rec.phases["restart"] = first - launched
        if rec.lost_steps:
            rec.phases["rerun"] = (min(caught_up) if caught_up else time.time()) - first
        self.reconfigurations.append(rec)
        self.out(rec.describe())
        return True

