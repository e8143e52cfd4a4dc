"""The training-program API: environment, data view, stop agreement and save, in one process
and in a gloo group of 2 forked processes."""

import json
import re
import traceback

import numpy as np
import pytest

from tenplex.data import DatasetIndex, DataState
from tenplex.elastic.api import Job, ParallelConfig, saved_dir, state_dir, stop_file
from tenplex.elastic.errors import ElasticError

torch = pytest.importorskip("torch")


def _index(tmp_path, n=32) -> DatasetIndex:
    return DatasetIndex.from_files("raw", str(tmp_path), [("data.bin", n * 4, range(0, n * 4, 4), [4] * n)])


def test_from_env_reads_controller_variables(tmp_path):
    env = {"TENPLEX_JOB_DIR": str(tmp_path), "TENPLEX_GENERATION": "2", "TENPLEX_TP": "2", "TENPLEX_DP": "2",
           "RANK": "3", "WORLD_SIZE": "4", "TENPLEX_STOP_STEP": "7"}  # fmt: skip
    job = Job.from_env(env=env)
    assert (job.generation, job.rank, job.world, job.config, job.stop_step) == (2, 3, 4, ParallelConfig(2, 2), 7)
    assert (job.dp_rank, job.tp_rank, job.pp_rank) == (1, 1, 0)
    env |= {"TENPLEX_TP": "2", "TENPLEX_DP": "2", "TENPLEX_PP": "2", "WORLD_SIZE": "8", "RANK": "6"}
    job = Job.from_env(env=env)
    assert (job.pp_rank, job.dp_rank, job.tp_rank) == (1, 1, 0)
    assert Job.from_env(tmp_path, env={"WORLD_SIZE": "3"}).config == ParallelConfig(1, 3)  # default: DP only
    assert Job.from_env(tmp_path, env={"WORLD_SIZE": "3", "TENPLEX_FAIL_RANKS": "2,0"}).fail == (2, 0)


def test_tensor_names_flatten_like_dcp():
    from tenplex.elastic.api import tensor_names

    sd = {"model": {"a.weight": torch.zeros(2)}, "optim": {"state": {"a.weight": {"exp_avg": torch.zeros(2), "step": torch.tensor(1.0)}},
                                                           "param_groups": [{"lr": 0.1}]}}  # fmt: skip
    assert tensor_names(sd) == ["model.a.weight", "optim.state.a.weight.exp_avg", "optim.state.a.weight.step"]


@pytest.mark.parametrize(
    ("env", "message"),
    [({}, "TENPLEX_JOB_DIR: the environment variable is not set"),
     ({"TENPLEX_JOB_DIR": "d", "TENPLEX_TP": "x"}, "TENPLEX_TP: expected an integer, got 'x'"),
     ({"TENPLEX_JOB_DIR": "d", "TENPLEX_TP": "2", "TENPLEX_DP": "2", "WORLD_SIZE": "2"},
      "TENPLEX_TP x TENPLEX_DP x TENPLEX_PP = 4 but WORLD_SIZE = 2"),
     ({"TENPLEX_JOB_DIR": "d", "RANK": "2", "WORLD_SIZE": "2"}, "RANK: 2 is not in 0..1"),
     ({"TENPLEX_JOB_DIR": "d", "WORLD_SIZE": "2", "TENPLEX_FAIL_RANKS": "1,x"}, "TENPLEX_FAIL_RANKS: expected comma-separated ranks, got '1,x'"),
     ({"TENPLEX_JOB_DIR": "d", "WORLD_SIZE": "2", "TENPLEX_FAIL_RANKS": "2"}, "TENPLEX_FAIL_RANKS: [2] must be ranks in 0..1, leaving a survivor"),
     ({"TENPLEX_JOB_DIR": "d", "WORLD_SIZE": "2", "TENPLEX_FAIL_RANKS": "0,1"}, "TENPLEX_FAIL_RANKS: [0, 1] must be ranks in 0..1")],
)  # fmt: skip
def test_from_env_errors_name_the_variable(env, message):
    with pytest.raises(ElasticError, match=re.escape(message)):
        Job.from_env(env=env)


def test_load_at_generation_zero_is_a_no_op_and_later_needs_state(tmp_path):
    assert Job(tmp_path, 0, 0, 1, ParallelConfig(1, 1)).load({}) is False
    with pytest.raises(ElasticError, match=re.escape(f"{state_dir(tmp_path, 1)}: generation 1 has no state")):
        Job(tmp_path, 1, 0, 1, ParallelConfig(1, 1)).load({})


def test_data_view_resumes_from_the_committed_state(tmp_path):
    index = _index(tmp_path)
    job = Job(tmp_path, 0, 3, 4, ParallelConfig(2, 2))  # dp rank 1 of 2
    data = job.data(index, seed=5, global_batch=8, micro_batch=2)
    assert data.view.start == 0 and data.view.world == 2 and data.view.rank == 1 and data.layout.accumulation_steps == 2
    assert list(data.view.step_at(0).ids) == list(data.order.batch(0)[4:])
    resumed = state_dir(tmp_path, 1)
    resumed.mkdir(parents=True)
    data.state.at_step(data.order, 3).save(resumed / "data_state.json")
    later = Job(tmp_path, 1, 0, 1, ParallelConfig(1, 1)).data(index, seed=5, global_batch=8, micro_batch=2)
    assert later.view.start == 3 and list(later.view.step_at(3).ids) == list(data.order.batch(3))
    with pytest.raises(Exception, match="seed"):
        Job(tmp_path, 1, 0, 1, ParallelConfig(1, 1)).data(index, seed=6, global_batch=8, micro_batch=2)


def test_should_stop_without_a_process_group(tmp_path):
    job = Job(tmp_path, 0, 0, 1, ParallelConfig(1, 1), stop_step=4)
    assert not job.should_stop(3) and job.should_stop(4)
    other = Job(tmp_path, 1, 0, 1, ParallelConfig(1, 1))
    assert not other.should_stop(0)
    stop_file(tmp_path, 1).parent.mkdir(parents=True, exist_ok=True)
    stop_file(tmp_path, 1).write_text("")
    assert other.should_stop(1)


# ---- two ranks in one gloo group ------------------------------------------------------------
def _ranks(tmp_path, world=2):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_entry, args=(r, world, tmp_path), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [f.read_text() for f in sorted(tmp_path.glob("err*"))]
    assert not errors, errors[0]
    assert [p.exitcode for p in procs] == [0] * world


def _entry(rank, world, tmp_path):
    try:
        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=rank, world_size=world)
        # only rank 1 was told a stop step: the all_reduce makes rank 0 agree
        job = Job(tmp_path / "job", 0, rank, world, ParallelConfig(1, 2), stop_step=5 if rank == 1 else None)
        answers = [job.should_stop(s) for s in (3, 4, 5)]
        if rank == 0:
            stop_file(job.job_dir, 0).write_text("")  # seen by rank 0 only; agreed by both
        torch.distributed.barrier()
        late = Job(tmp_path / "job", 0, rank, world, ParallelConfig(1, 2))
        answers.append(late.should_stop(0))
        state = {"w": torch.full((4,), float(rank == 0))}  # replicated: DCP keeps rank 0's copy
        job.save(state, DataState.from_json({"version": 1, "fingerprint": "f", "seed": 0, "epoch": 0, "cursor": 0,
                                             "global_batch": 2, "tail_policy": "drop"}))  # fmt: skip
        (tmp_path / f"answers{rank}.json").write_text(json.dumps(answers))
        torch.distributed.destroy_process_group()
    except BaseException:
        (tmp_path / f"err{rank}").write_text(traceback.format_exc())


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_stop_agreement_and_save_with_two_ranks(tmp_path):
    (tmp_path / "job" / "control").mkdir(parents=True)
    _ranks(tmp_path)
    for r in range(2):
        assert json.loads((tmp_path / f"answers{r}.json").read_text()) == [False, False, True, True]
    saved = saved_dir(tmp_path / "job", 0)
    assert {p.name for p in saved.iterdir()} >= {".metadata", "COMPLETE", "data_state.json", "timing.json"}
    timing = json.loads((saved / "timing.json").read_text())
    assert timing["stop_step"] == 5 and timing["save_start"] <= timing["save_end"]
    from tenplex.frameworks.dcp.load import load_dcp

    target = {"w": torch.zeros(4)}
    load_dcp(target, saved, rank=0)
    assert np.array_equal(target["w"].numpy(), np.ones(4))
