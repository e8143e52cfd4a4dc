"""The parallelizer: plausible choices, optimality over its own enumeration, tables, and errors."""

import attrs
import pytest

from tenplex.elastic.parallelizer.choose import Choice, NoFitError, TableEntryError, choose, describe
from tenplex.elastic.parallelizer.cost import (
    Hardware,
    Workload,
    check_valid,
    evaluate,
    local_params,
    split_layers,
    stage_memory,
)
from tenplex.frontends.parallel import Cluster, fit
from tenplex.frontends.presets import preset
from tenplex.ir.errors import SpecError, TenplexError

MODELS = ("gpt-tiny", "gpt-1.3b", "gpt-6.7b", "llama-7b")


def brute_force(devices, model, gpus_per_host, w=None):
    """Every valid layout and its prediction, by plain nested loops over all (tp, pp, dp)."""
    w = w or Workload(512, 1, model.max_position or 2048)
    out = []
    for tp in range(1, devices + 1):
        for pp in range(1, devices + 1):
            for dp in range(1, devices + 1):
                if tp * pp * dp == devices and check_valid(model, tp, pp, dp, gpus_per_host, w) is None:
                    out.append(evaluate(model, tp, pp, dp, gpus_per_host, w, Hardware(), 80e9))
    return out


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus_per_host", [4, 8])
def test_choose_is_the_best_fitting_layout(name, gpus_per_host):
    model = preset(name)
    for devices in range(1, 65):
        fitting = [c for c in brute_force(devices, model, gpus_per_host) if c.fits]
        if not fitting:
            with pytest.raises(NoFitError):
                choose(devices, model, gpus_per_host)
            continue
        choice = choose(devices, model, gpus_per_host)
        assert choice.tp * choice.pp * choice.dp == devices
        assert choice.memory_bytes <= 80e9
        assert choice.step_seconds == min(c.step_seconds for c in fitting), (name, devices)
        assert choice.best == min(fitting, key=lambda c: c.key)
        assert gpus_per_host % choice.tp == 0 or devices <= gpus_per_host  # TP never spans hosts


@pytest.mark.parametrize("name", ["gpt-1.3b", "llama-7b"])
def test_choice_is_valid_for_the_frontend(name):
    model = preset(name)
    choice = choose(12, model, 4)
    parallel = choice.parallel(model)
    assert fit(model, parallel, Cluster(3, 4)).dp == choice.dp


def test_small_model_on_one_host_prefers_dp():
    choice = choose(8, preset("gpt-1.3b"), 8)
    assert (choice.tp, choice.pp, choice.dp) == (1, 1, 8)
    text = choice.explain()
    assert "pp=1: no pipeline bubble" in text and "dp=8" in text and "Next best" in text


@pytest.mark.parametrize("name", ["gpt-6.7b", "llama-7b"])
def test_model_too_big_for_one_gpu_gets_tp_inside_the_host_before_pp(name):
    model = preset(name)
    with pytest.raises(NoFitError):
        choose(1, model, 8)
    choice = choose(8, model, 8)
    assert choice.tp > 1 and choice.pp == 1
    assert "inside a host (NVLink)" in choice.explain()


def test_gpt_175b_on_1024_gpus_takes_the_papers_shape():
    # Narayanan et al. 2021 train GPT-3 175B with tp=8 and a pipeline, batch 1536, recomputation.
    choice = choose(1024, preset("gpt-175b"), 8, global_batch=1536, recompute=True)
    assert choice.tp == 8 and choice.pp > 1
    assert f"pp={choice.pp} (layers" in choice.explain()


@pytest.mark.parametrize("global_batch", [512, 7 * 64])
def test_prime_device_count_still_fits(global_batch):
    choice = choose(7, preset("gpt-1.3b"), 8, global_batch=global_batch)
    assert (choice.tp, choice.pp, choice.dp) in {(1, 1, 7), (1, 7, 1)}
    if choice.pp == 7:
        assert choice.best.stage_layers == (3, 4, 4, 4, 3, 3, 3)


def test_table_entry_overrides_the_model():
    model = preset("gpt-1.3b")
    choice = choose(8, model, 8, table={8: (2, 2, 2), 4: (1, 1, 4)})
    assert (choice.source, choice.tp, choice.pp, choice.dp) == ("table", 2, 2, 2)
    assert choice.model_best.name == "tp=1,pp=1,dp=8"
    assert "from the user table" in choice.explain()
    assert "The cost model would pick tp=1,pp=1,dp=8" in choice.explain()
    assert choose(16, model, 8, table={8: (2, 2, 2)}).source == "model"  # no entry: the cost model


def test_deterministic_and_ordered():
    model = preset("gpt-1.3b")
    a, b = choose(32, model, 8), choose(32, model, 8)
    assert a == b and a.explain() == b.explain()
    fitting = [c for c in a.candidates if c.fits]
    assert fitting == sorted(fitting, key=lambda c: c.key)
    assert a.runners_up == tuple(fitting[1:4])


@pytest.mark.parametrize(
    ("num_layers", "pp", "counts"),
    [
        pytest.param(24, 4, (6, 6, 6, 6), id="even"),
        pytest.param(24, 7, (3, 4, 4, 4, 3, 3, 3), id="middle_first"),
        pytest.param(24, 5, (5, 5, 5, 5, 4), id="then_first"),
        pytest.param(25, 2, (13, 12), id="two_stages_first"),
        pytest.param(24, 1, (24,), id="one_stage"),
    ],
)
def test_split_layers(num_layers, pp, counts):
    assert split_layers(num_layers, pp) == counts


def test_memory_is_16_bytes_per_parameter_plus_activations():
    model = preset("gpt-1.3b")
    layer, first, last, _ = local_params(model, 1, 1)
    params = 24 * layer + first + last
    w = Workload(512, 1, 2048)
    mem = stage_memory(model, 1, (24,), 8, w, Hardware())
    assert (mem.weights, mem.grads, mem.optimizer) == (2 * params, 2 * params, 12 * params)
    assert stage_memory(model, 1, (24,), 8, attrs.evolve(w, zero1=True), Hardware()).optimizer == 12 * params / 8
    assert stage_memory(model, 1, (24,), 8, attrs.evolve(w, recompute=True), Hardware()).activations < mem.activations


def test_no_fit_names_devices_model_and_smallest_need():
    with pytest.raises(NoFitError, match=r"fits 8 devices with 80.0 GB per GPU: the smallest need is [0-9.]+ GB") as e:
        choose(8, preset("gpt-175b"), 8)
    assert "gpt model (175B parameters" in str(e.value)
    assert isinstance(e.value, TenplexError)


def test_no_valid_layout_names_the_reasons():
    with pytest.raises(
        NoFitError, match=r"no valid \(tp, pp, dp\) of the gpt model .* for 7 devices: tp=1,pp=1,dp=7: "
    ):
        choose(7, preset("gpt-tiny"), 8)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({8: (2, 2)}, r"table entry 8: \(2, 2\) must map a device count >= 1 to \(tp, pp, dp\)"),
        ({8: (2, 2, 0)}, r"table entry 8: \(2, 2, 0\) must be three integers >= 1"),
        ({8: (2, 2, 1)}, r"table entry 8: tp\*pp\*dp = 2\*2\*1 = 4, not 8"),
        (
            {8: (8, 1, 1), 3: (3, 1, 1)},
            r"table entry 3: \(tp=3, pp=1, dp=1\) is invalid .*tp=3 does not divide heads=16",
        ),
        ({16: (16, 1, 1)}, r"tp=16 would put a tensor-parallel group across hosts of 8 GPUs"),
        (
            {8: (1, 1, 8)},
            r"table entry 8: \(tp=1, pp=1, dp=8\) needs [0-9.]+ GB per GPU .* but memory_per_gpu is 20.0 GB",
        ),
    ],
)
def test_bad_table_entries(table, message):
    devices = max(table) if 3 not in table else 3
    with pytest.raises(TableEntryError, match=message):
        choose(devices, preset("gpt-1.3b"), 8, table=table, memory_per_gpu=20e9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": 0}, r"devices=0 must be an integer >= 1"),
        ({"gpus_per_host": 0}, r"gpus_per_host=0 must be an integer >= 1"),
        ({"micro_batch": 3}, r"dp\*micro_batch = 1\*3 = 3 does not divide global_batch=512"),
        ({"memory_per_gpu": 0}, r"memory_per_gpu=0 must be > 0 bytes"),
        ({"seq": 4096}, r"seq=4096 exceeds the model's max_position=2048"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"devices": 1, "gpus_per_host": 8, **kwargs}
    with pytest.raises(SpecError, match=message):
        choose(args.pop("devices"), preset("gpt-1.3b"), args.pop("gpus_per_host"), **args)


def test_choice_verifies_itself():
    choice = choose(8, preset("gpt-1.3b"), 8)
    with pytest.raises(SpecError, match=r"choice source='guess' is not one of \['model', 'table'\]"):
        attrs.evolve(choice, source="guess")
    with pytest.raises(SpecError, match=r"choice tp=1,pp=1,dp=8 does not use exactly 4 devices"):
        attrs.evolve(choice, devices=4)
    with pytest.raises(SpecError, match=r"choice tp=1,pp=1,dp=8 needs [0-9.]+ GB > 10.0 GB"):
        attrs.evolve(choice, best=attrs.evolve(choice.best, fits=False), memory_per_gpu=10e9)
    assert isinstance(choice, Choice) and describe(preset("gpt-tiny")).startswith("gpt model (0.274M")
