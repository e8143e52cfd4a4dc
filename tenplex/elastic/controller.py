"""The elastic controller: run a job's generations and reconfigure between them.

`Controller(spec, job_dir).run()` launches generation 0 on `spec.devices` processes and, for
each resource change (a schedule event or a `control/scale-*.json` request written by
`tenplex job scale`), carries out one reconfiguration:

1. choose the new (tp, dp) (`configs.choose_config`); a change to the same layout is ignored;
2. stop: an `at_step` event is passed to the program up front (TENPLEX_STOP_STEP, exact and
   deterministic); `at_seconds` events and scale requests write `control/stop-N`;
3. wait for the program to save (`saved/gen-N/COMPLETE`) and exit;
4. reshard: `reshard_dcp(saved/gen-N, layout_json(tp, dp, plan), state/gen-N+1)` — tenplex
   compiles and executes the verified plan — and copy the data state beside it;
5. relaunch torchrun with the new W and generation N + 1.

Each reconfiguration records its phases in seconds: `stop` (request → the ranks agree to
stop), `save` (their checkpoint), `exit` (process teardown), `reshard` (compile + execute +
write) and `restart` (launch → first step of the new generation logged). The report is printed
and written to `JOB_DIR/report.json`.

Invariants:
- at most one generation runs at a time; its process tree is always ended (killed after
  `spec.timeout` seconds or on any error) and reaped;
- generation N + 1 starts only from a complete `saved/gen-N` (COMPLETE present).

Raises ElasticError naming the generation, its exit code and log file, or a missing checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic import launch as launcher
from tenplex.elastic.api import ParallelConfig, metrics_file, saved_dir, state_dir, stop_file
from tenplex.elastic.configs import choose_config
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import Event, JobSpec
from tenplex.elastic.layouts import gpt_plan, layout_json

POLL = 0.05


@attrs.frozen
class Reconfiguration:
    """One change of layout and the seconds each phase took."""

    step: int
    src: ParallelConfig
    dst: ParallelConfig
    phases: dict[str, float]
    bytes_moved: int

    def describe(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.phases.items())
        return (f"step {self.step}: tp{self.src.tp} dp{self.src.dp} (W={self.src.world}) -> tp{self.dst.tp} dp{self.dst.dp} "
                f"(W={self.dst.world}): {parts}; total {total:.2f}s, {self.bytes_moved} bytes resharded")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "src": self.src.to_json(), "dst": self.dst.to_json(), "phases": self.phases,
                "bytes_moved": self.bytes_moved}  # fmt: skip


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ElasticError(f"{path}: cannot read ({e})") from None


class Controller:
    """Runs one elastic job (see the module docstring). `plan` is the program's TP plan."""

    def __init__(self, spec: JobSpec, job_dir: str | Path, *, plan: dict[str, str] | None = None,
                 out: Callable[[str], None] = print) -> None:  # fmt: skip
        self.spec, self.job_dir, self.out = spec, Path(job_dir).resolve(), out
        self.plan = plan if plan is not None else gpt_plan(_layers(spec))
        self.pending = list(spec.schedule)
        self.reconfigurations: list[Reconfiguration] = []
        self.start = 0.0

    def run(self) -> list[Reconfiguration]:
        """Run every generation to the end; returns the reconfigurations (also in report.json)."""
        if saved_dir(self.job_dir, 0).exists():
            raise ElasticError(f"{self.job_dir}: the job directory was used before; give a fresh one")
        (self.job_dir / "control").mkdir(parents=True, exist_ok=True)
        self.start = time.time()
        generation, config, pending = 0, choose_config(self.spec, self.spec.devices), None
        while True:
            self.out(f"generation {generation}: tp{config.tp} dp{config.dp} (W={config.world})")
            event, signal_time, timing = self._run_generation(generation, config, pending)
            if event is None:
                break
            dst = choose_config(self.spec, event.devices, event.tp)
            pending = self._reshard(generation, config, dst, timing, signal_time)
            generation, config = generation + 1, dst
        report = {"total_seconds": time.time() - self.start, "generations": generation + 1,
                  "reconfigurations": [r.to_json() for r in self.reconfigurations]}  # fmt: skip
        (self.job_dir / "report.json").write_text(json.dumps(report, indent=1))
        return self.reconfigurations

    def _next_step_event(self) -> int | None:
        return self.pending[0].at_step if self.pending and self.pending[0].at_step is not None else None

    def _run_generation(self, generation: int, config: ParallelConfig,
                        pending: Reconfiguration | None) -> tuple[Event | None, float, dict]:  # fmt: skip
        """Run one generation to its exit. Returns the event that stopped it (None: it finished),
        when the stop was requested, and its saved timing. `pending` (the reconfiguration that
        led here) gets its restart phase once this generation logs its first step."""
        launched = time.time()
        proc = launcher.launch(self.spec, self.job_dir, generation, config, self._next_step_event())
        requested: tuple[Event, float] | None = None
        try:
            while proc.poll() is None:
                if time.time() - launched > self.spec.timeout:
                    raise ElasticError(f"generation {generation}: still running after timeout={self.spec.timeout}s; "
                                       f"log {launcher.log_path(self.job_dir, generation)}")  # fmt: skip
                if requested is None:
                    requested = self._poll_request(generation, config)
                if pending is not None and self._step_times(generation):
                    self._finish(pending, generation, launched)
                    pending = None
                time.sleep(POLL)
        finally:
            launcher.terminate(proc)
        exited = time.time()
        if proc.returncode != 0:
            raise ElasticError(f"generation {generation}: the program exited with code {proc.returncode}; "
                               f"log {launcher.log_path(self.job_dir, generation)}:\n{launcher.log_tail(self.job_dir, generation)}")  # fmt: skip
        if pending is not None:
            self._finish(pending, generation, launched)
        saved = saved_dir(self.job_dir, generation)
        if not (saved / "COMPLETE").exists():
            raise ElasticError(f"{saved}: generation {generation} exited without a complete checkpoint (no COMPLETE)")
        timing = {**_read_json(saved / "timing.json"), "exit": exited}
        if "stop_step" not in timing:
            return None, 0.0, timing  # the program finished its steps
        if requested is not None:
            return (*requested, timing)
        times = self._step_times(generation)  # an at_step stop: requested when the last step ended
        return self.pending.pop(0), max(times) if times else timing["stop"], timing

    def _poll_request(self, generation: int, config: ParallelConfig) -> tuple[Event, float] | None:
        """A due at_seconds event or scale request that changes the layout: request the stop."""
        event = None
        if self.pending and self.pending[0].at_seconds is not None and time.time() - self.start >= self.pending[0].at_seconds:
            event = self.pending.pop(0)
        for path in sorted((self.job_dir / "control").glob("scale-*.json")):
            doc = _read_json(path)
            path.rename(path.with_suffix(".taken"))
            event = Event(int(doc["devices"]), tp=doc.get("tp"))
        if event is None or choose_config(self.spec, event.devices, event.tp) == config:
            return None
        stop_file(self.job_dir, generation).write_text(json.dumps({"devices": event.devices}))
        return event, time.time()

    def _reshard(self, generation: int, src: ParallelConfig, dst: ParallelConfig, timing: dict,
                 signal_time: float) -> Reconfiguration:  # fmt: skip
        """Reshard generation N's saved state into N + 1's layout; the reconfiguration so far."""
        from tenplex.frameworks.dcp_reshard import reshard_dcp

        begin = time.time()
        out = state_dir(self.job_dir, generation + 1)
        result = reshard_dcp(saved_dir(self.job_dir, generation), layout_json(dst.tp, dst.dp, self.plan), out)
        shutil.copy(saved_dir(self.job_dir, generation) / "data_state.json", out / "data_state.json")
        phases = {"stop": max(0.0, timing["stop"] - signal_time), "save": timing["save_end"] - timing["stop"],
                  "exit": timing["exit"] - timing["save_end"], "reshard": time.time() - begin}  # fmt: skip
        return Reconfiguration(int(timing["stop_step"]), src, dst, phases, result.bytes_moved)

    def _finish(self, rec: Reconfiguration, generation: int, launched: float) -> None:
        times = self._step_times(generation)
        rec.phases["restart"] = (min(times) if times else time.time()) - launched
        self.reconfigurations.append(rec)
        self.out(rec.describe())

    def _step_times(self, generation: int) -> list[float]:
        path = metrics_file(self.job_dir)
        if not path.exists():
            return []
        times = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line rank 0 is still writing
            if record.get("generation") == generation and "time" in record:
                times.append(record["time"])
        return times


def _layers(spec: JobSpec) -> int:
    """The example GPT's layer count: job.model.num_layers, else the program's --layers, else 2."""
    if spec.model and "num_layers" in spec.model:
        return int(spec.model["num_layers"])
    args = list(spec.args)
    return int(args[args.index("--layers") + 1]) if "--layers" in args[:-1] else 2
