"""The compiler passes on named examples: locality, forwarding, NIC balance, rank placement,
scheduling, coalescing, padding fills and pass ordering.

Topology: hosts h0..h3 with two devices each (device d is on host h{d // 2}).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from tenplex.compiler import CompileOptions, CopyOp, FillOp, check_plan, compile_plan, network_lower_bound
from tenplex.compiler.diff import diff
from tenplex.compiler.passes.coalesce import Coalesce
from tenplex.compiler.passes.lower import Lower
from tenplex.compiler.passes.schedule import Schedule
from tenplex.compiler.passes.select_sources import SelectSources
from tenplex.compiler.program import Program, run_passes
from tenplex.ir import (
    PTC,
    Allocation,
    Box,
    CompileError,
    Device,
    Partition,
    Piece,
    SubTensor,
    TensorMeta,
    Topology,
    row_major_boxes,
)
from tenplex.ir.topology import LinkClass
from tenplex.runtime.oracle import check_execution

TOPOLOGY = Topology(tuple(Device(d, f"h{d // 2}") for d in range(8)))
W = TensorMeta("w", (8, 4), "float32")  # 128 bytes


def whole(sid: str, meta: TensorMeta = W) -> SubTensor:
    return SubTensor(sid, meta.name, f"model/{meta.name}", meta.shape, [Piece(meta.box, meta.box)])


def rows(sid: str, a: int, b: int, meta: TensorMeta = W) -> SubTensor:
    box = Box((a,) + (0,) * (len(meta.shape) - 1), (b,) + meta.shape[1:])
    return SubTensor(sid, meta.name, f"model/{meta.name}", box.shape, [Piece(box, Box.from_shape(box.shape))])


def ptc(subtensors, partitions: dict[str, list[str]], allocation: dict[str, list[int]], tensors=(W,)) -> PTC:
    parts = tuple(Partition(pid, sids) for pid, sids in partitions.items())
    return PTC(tuple(tensors), tuple(subtensors), parts, Allocation(allocation), TOPOLOGY)


def replicated(devices: list[int], tensors=(W,)) -> PTC:
    """Every tensor whole in one partition `p`, on `devices` (DP replicas)."""
    return ptc([whole(f"{t.name}/p", t) for t in tensors], {"p": [f"{t.name}/p" for t in tensors]}, {"p": devices}, tensors)


def compiled(src: PTC, dst: PTC, **options):
    plan = compile_plan(src, dst, CompileOptions(**options))
    check_plan(plan, src, dst)
    check_execution(plan, src, dst)
    return plan


def by_class(plan) -> tuple[int, int, int]:
    return plan.stats.device_bytes, plan.stats.host_bytes, plan.stats.network_bytes


def network_copies(plan) -> list[CopyOp]:
    return [op for op in plan.ops if isinstance(op, CopyOp) and TOPOLOGY.link(op.src_device, op.dst_device) is LinkClass.NETWORK]


# -- select-sources: locality ---------------------------------------------------------------

LOCAL = [
    # name, src devices, dst devices, (device, host, network) bytes
    ("dp_same", [0, 1], [0, 1], (256, 0, 0)),
    ("dp_shrink", [0, 1, 2, 3], [0, 2], (256, 0, 0)),
    ("dp_shrink_to_one_host", [0, 1, 2, 3], [2, 3], (256, 0, 0)),
    ("dp_grow_inside_hosts", [0, 2], [0, 1, 2, 3], (256, 256, 0)),
]


@pytest.mark.parametrize("place_ranks", [False, True])
@pytest.mark.parametrize(("name", "src_devices", "dst_devices", "expected"), LOCAL, ids=[c[0] for c in LOCAL])
def test_dp_only_change_stays_local(name, src_devices, dst_devices, expected, place_ranks):
    plan = compiled(replicated(src_devices), replicated(dst_devices), place_ranks=place_ranks)
    assert by_class(plan) == expected


def test_tp_shards_on_one_device_merge_locally():
    src = ptc([rows("w/tp0", 0, 4), rows("w/tp1", 4, 8)], {"tp0": ["w/tp0"], "tp1": ["w/tp1"]}, {"tp0": [0], "tp1": [0]})
    plan = compiled(src, replicated([0]))
    assert by_class(plan) == (128, 0, 0)


# -- select-sources: one network copy per host, then forwards -------------------------------

REMOTE = [
    # name, src devices, dst devices, (device, host, network) bytes
    ("one_src_two_dst_hosts", [0], [2, 3, 4, 5], (0, 256, 256)),
    ("dst_host_with_a_replica", [0, 2], [1, 3, 4, 5], (0, 384, 128)),
    ("dst_on_src_devices_and_beyond", [0], [0, 1, 2, 3, 4, 5, 6, 7], (128, 512, 384)),
]


@pytest.mark.parametrize(("name", "src_devices", "dst_devices", "expected"), REMOTE, ids=[c[0] for c in REMOTE])
def test_remote_replicas_are_fetched_once_per_host_and_forwarded(name, src_devices, dst_devices, expected):
    src, dst = replicated(src_devices), replicated(dst_devices)
    plan = compiled(src, dst, place_ranks=False, max_message_bytes=48)
    assert by_class(plan) == expected
    assert plan.stats.network_bytes == network_lower_bound(src, dst)
    received = Counter(TOPOLOGY.host_of(op.dst_device) for op in network_copies(plan) for _ in range(op.box.volume))
    assert set(received.values()) <= {W.box.volume}  # each host receives each element once
    forwards = [op for op in plan.ops if isinstance(op, CopyOp) and op.src_side == "dst"]
    assert all(TOPOLOGY.link(op.src_device, op.dst_device) is LinkClass.HOST for op in forwards)


# -- select-sources: NIC balance ------------------------------------------------------------

E = TensorMeta("e", (10, 3), "float64")  # 240 bytes


@pytest.mark.parametrize("max_message_bytes", [24, 48, 4096])
def test_two_src_hosts_share_the_egress(max_message_bytes):
    tensors = (W, E)
    src, dst = replicated([0, 2], tensors), replicated([4, 6], tensors)
    plan = compiled(src, dst, place_ranks=False, max_message_bytes=max_message_bytes)
    egress: Counter[str] = Counter()
    atom = 0
    for op in network_copies(plan):
        nbytes = op.box.volume * (4 if op.tensor == "w" else 8)
        egress[TOPOLOGY.host_of(op.src_device)] += nbytes
        atom = max(atom, nbytes)
    total = plan.stats.network_bytes
    assert total == 2 * (128 + 240)
    assert set(egress) == {"h0", "h1"}
    assert max(egress.values()) <= math.ceil(total / 2) + atom


# -- place-ranks ------------------------------------------------------------------------------

QUARTERS = [rows(f"w/q{i}", 2 * i, 2 * i + 2) for i in range(4)]
Q_PARTS = {f"q{i}": [f"w/q{i}"] for i in range(4)}
PERMUTED = [
    # name, dst device of q0..q3 (src: q_i on device i), bytes with place-ranks off
    ("inside_hosts", [1, 0, 3, 2], (0, 128, 0)),
    ("hosts_swapped", [2, 3, 0, 1], (0, 0, 128)),
    ("hosts_swapped_and_permuted", [3, 2, 1, 0], (0, 0, 128)),
]


@pytest.mark.parametrize(("name", "devices", "without"), PERMUTED, ids=[c[0] for c in PERMUTED])
def test_place_ranks_recovers_a_permuted_allocation(name, devices, without):
    src = ptc(QUARTERS, Q_PARTS, {f"q{i}": [i] for i in range(4)})
    dst = ptc(QUARTERS, Q_PARTS, {f"q{i}": [d] for i, d in enumerate(devices)})
    placed = compiled(src, dst, place_ranks=True)
    assert by_class(placed) == (128, 0, 0)
    assert all(op.src_device == op.dst_device for op in placed.ops if isinstance(op, CopyOp))
    assert placed.allocation == src.allocation
    assert by_class(compiled(src, dst, place_ranks=False)) == without


def test_place_ranks_never_moves_more_network_bytes_than_the_identity():
    # h0 = {0, 1}, h1 = {2, 3}; src holds x (8 bytes) and y (4 bytes) on device 0. The identity
    # sends x to h1 once (8 bytes); swapping the hosts "keeps" x twice on paper (two replicas on
    # h1's slots) but sends x and y to h1 (12 bytes).
    x, y = TensorMeta("x", (2,), "float32"), TensorMeta("y", (1,), "float32")
    src = ptc([whole("x/s", x), whole("y/s", y)], {"s": ["x/s", "y/s"]}, {"s": [0]}, (x, y))
    dst = ptc([whole("y/a", y), whole("x/b", x)], {"a": ["y/a"], "b": ["x/b"], "c": []}, {"a": [0], "b": [0, 2, 3], "c": [1]}, (x, y))
    identity = compiled(src, dst, place_ranks=False).stats.network_bytes
    assert identity == 8
    assert compiled(src, dst, place_ranks=True).stats.network_bytes <= identity


def test_place_ranks_keeps_an_allocation_already_in_place():
    src = ptc(QUARTERS, Q_PARTS, {f"q{i}": [i] for i in range(4)})
    assert compiled(src, src, place_ranks=True).allocation == src.allocation


# -- schedule -------------------------------------------------------------------------------


@pytest.mark.parametrize(("max_message_bytes", "budget"), [(16, 16), (32, 64), (48, 100), (128, 256)])
def test_schedule_keeps_each_round_within_the_budget(max_message_bytes, budget):
    tensors = (W, E)
    plan = compiled(replicated([0], tensors), replicated([2, 3, 4], tensors),
                    place_ranks=False, max_message_bytes=max_message_bytes, memory_budget_bytes=budget)  # fmt: skip
    load: Counter[tuple[int, str]] = Counter()
    for m in plan.messages:
        assert m.bytes <= max_message_bytes
        if m.src_host != m.dst_host:
            load[(m.round, m.src_host)] += m.bytes
            load[(m.round, m.dst_host)] += m.bytes
    assert max(load.values()) <= budget
    assert plan.stats.rounds >= math.ceil(2 * (128 + 240) / budget)  # h0 sends every byte twice
    for a, b in plan.edges:
        assert plan.round_of[a] < plan.round_of[b]
    forwards = [i for i, op in enumerate(plan.ops) if isinstance(op, CopyOp) and op.src_side == "dst"]
    assert forwards and all(any(b == i for _, b in plan.edges) for i in forwards)


# -- coalesce -------------------------------------------------------------------------------

SMALL = tuple(TensorMeta(f"s{i}", (1,), "float32") for i in range(8))  # 4 bytes each


@pytest.mark.parametrize(("max_message_bytes", "messages"), [(4, 8), (12, 3), (16, 2), (4096, 1)])
def test_coalesce_packs_copies_into_messages(max_message_bytes, messages):
    plan = compiled(replicated([0], SMALL), replicated([2], SMALL), max_message_bytes=max_message_bytes)
    assert len(plan.messages) == messages
    assert all(m.bytes <= max_message_bytes for m in plan.messages)
    assert sum(m.bytes for m in plan.messages) == 32


def test_coalesce_keeps_host_pairs_apart():
    plan = compiled(replicated([0], SMALL), replicated([2, 4], SMALL), max_message_bytes=4096)
    network = sorted((m.src_host, m.dst_host) for m in plan.messages if m.src_host != m.dst_host)
    assert network == [("h0", "h1"), ("h0", "h2")]


# -- diff: fills for padding ----------------------------------------------------------------

EMB = TensorMeta("emb", (6, 2), "float32")


def flat_pieces(shape, start: int, stop: int, at: int) -> list[Piece]:
    """Flat range [start, stop) of `shape` as consecutive 1-D local runs from `at` (ZeRO)."""
    out = []
    for g in row_major_boxes(shape, start, stop):
        out.append(Piece(g, Box((at,), (at + g.volume,))))
        at += g.volume
    return out


def _padded_dst() -> PTC:
    tp0 = rows("emb/tp0", 0, 4, EMB)
    tp1 = SubTensor("emb/tp1", "emb", "model/emb", (4, 2), [Piece(Box((4, 0), (6, 2)), Box((0, 0), (2, 2)))], fill=-1)
    flat = SubTensor("emb/zero", "emb", "optim/emb", (6,), flat_pieces((6, 2), 4, 7, at=1), fill=7)  # 1 + 3 + 2
    return PTC((EMB,), (tp0, tp1, flat), (Partition("tp0", ["emb/tp0"]), Partition("tp1", ["emb/tp1", "emb/zero"])),
               Allocation({"tp0": [2], "tp1": [3, 5]}), TOPOLOGY)  # fmt: skip


def test_diff_fills_padding_with_the_fill_value():
    src, dst = replicated([0], (EMB,)), _padded_dst()
    fills = sorted(diff(src, dst).fills, key=lambda f: (f.dst_subtensor, f.dst_device, f.box))
    assert [(f.dst_subtensor, f.dst_device, f.box.to_list(), f.value) for f in fills] == [
        ("emb/tp1", 3, [[2, 4], [0, 2]], -1),
        ("emb/tp1", 5, [[2, 4], [0, 2]], -1),
        ("emb/zero", 3, [[0, 1]], 7),
        ("emb/zero", 3, [[4, 6]], 7),
        ("emb/zero", 5, [[0, 1]], 7),
        ("emb/zero", 5, [[4, 6]], 7),
    ]
    plan = compiled(src, dst)
    assert {op for op in plan.ops if isinstance(op, FillOp)} == set(fills)
    assert plan.stats.fill_bytes == (2 * 4 + 2 * 3) * 4


def test_diff_makes_no_fills_without_padding():
    assert diff(replicated([0]), replicated([1, 2])).fills == ()


# -- the pass pipeline ----------------------------------------------------------------------

OUT_OF_ORDER = [
    ("coalesce_first", [Coalesce()], "pass 'coalesce' requires ['sources']"),
    ("coalesce_before_select_sources", [Lower(), Coalesce(), SelectSources()], "pass 'coalesce' requires ['sources']"),
    ("select_sources_before_lower", [SelectSources(), Lower()], "pass 'select-sources' requires ['lowered']"),
    ("schedule_before_coalesce", [Lower(), SelectSources(), Schedule(), Coalesce()], "pass 'schedule' requires ['messages']"),
]


@pytest.mark.parametrize(("name", "passes", "message"), OUT_OF_ORDER, ids=[c[0] for c in OUT_OF_ORDER])
def test_passes_out_of_order_are_rejected(name, passes, message):
    program = Program.start(replicated([0]), replicated([2]), CompileOptions())
    with pytest.raises(CompileError, match=re.escape(message)):
        run_passes(program, passes)


def test_passes_in_order_provide_every_fact():
    program = run_passes(Program.start(replicated([0]), replicated([2]), CompileOptions()), [Lower(), SelectSources(), Coalesce(), Schedule()])
    assert program.facts == {"lowered", "sources", "messages", "scheduled"}


@pytest.mark.parametrize(
    ("src_spec", "dst_spec"),
    [
        pytest.param("gpt-tiny:tp4,pp2,dp1@2x4", "gpt-tiny:tp4,pp2,dp2@4x4", id="scale_up"),
        pytest.param("gpt-tiny:tp2,pp4,dp2@4x4", "gpt-tiny:tp2,pp4,dp1@2x4", id="scale_down"),
        pytest.param("gpt-tiny:tp2,pp2,dp1,zero1@1x4", "gpt-tiny:tp2,pp2,dp2,zero1@2x4", id="zero1"),
    ],
)
def test_place_ranks_keeps_tensor_parallel_groups_inside_a_host(src_spec, dst_spec):
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    plan = compile_plan(src, dst, CompileOptions(place_ranks=True))
    host = {d.id: d.host for d in dst.topology.devices}
    alloc = plan.allocation.mapping
    for pid, devices in alloc.items():
        if "-tp0" in pid and "-dp" not in pid:
            peers = [alloc[pid.replace("-tp0", f"-tp{t}")] for t in range(1, 8) if pid.replace("-tp0", f"-tp{t}") in alloc]
            for replica, device in enumerate(devices):
                assert {host[p[replica]] for p in peers} <= {host[device]}, (pid, devices, peers)
    assert plan.stats.network_bytes <= compile_plan(src, dst, CompileOptions(place_ranks=False)).stats.network_bytes


def test_plan_graph_orders_forwards_after_their_landing():
    plan = compiled(replicated([0], (W,)), replicated([2, 3], (W,)), place_ranks=False)
    generations = plan.graph.generations()
    assert len(generations) == 2 and plan.graph.frozen
    for a, b in plan.edges:
        assert a in generations[0] and b in generations[1]
        assert plan.ops[b].src_side == "dst" and plan.ops[a].dst_device == plan.ops[b].src_device


def test_diff_needs_of_tensors_alike_are_the_needs_computed_per_tensor():
    """diff computes one tensor per kind (devices and piece boxes alike) and puts the others'
    ids into its needs; they must be the needs computed for each tensor on its own, holder
    tuples shared alike. Kinds here: split rows (three tensors, one on other devices), whole
    replicas (two), and tied copies (two, each a device holding two sub-tensors with one box)."""
    from tenplex.compiler.diff import _tensor_needs

    metas = [TensorMeta(n, (8, 4), "float32") for n in ("a", "b", "c", "d", "e", "f", "g")]
    a, b, c, d, e, f, g = metas
    src = ptc(
        [rows("a/0", 0, 4, a), rows("a/1", 4, 8, a), rows("b/0", 0, 4, b), rows("b/1", 4, 8, b), rows("c/0", 0, 4, c),
         rows("c/1", 4, 8, c), whole("d/0", d), whole("e/0", e), whole("f/0", f), whole("f/1", f), whole("g/0", g), whole("g/1", g)],
        {"p0": ["a/0", "b/0", "d/0", "e/0", "f/0", "f/1", "g/0", "g/1"], "p1": ["a/1", "b/1"], "p2": ["c/0"], "p3": ["c/1"]},
        {"p0": [0, 2], "p1": [1, 3], "p2": [4], "p3": [5]}, metas)  # fmt: skip
    dst = ptc(
        [rows(f"{m.name}/{i}", 2 * i, 2 * i + 2, m) for m in metas for i in range(4)],
        {f"q{i}": [f"{m.name}/{i}" for m in metas] for i in range(4)},
        {f"q{i}": [i + 4, (i + 2) % 8] for i in range(4)}, metas)  # fmt: skip
    got = diff(src, dst).needs
    want = [n for m in metas for n in _tensor_needs(src, dst, m.name, {})]
    assert list(got) == want
    shared = lambda needs: [[j for j, o in enumerate(needs) if o.holders is n.holders] for n in needs]  # noqa: E731
    assert shared(got) == shared(want)


@pytest.mark.parametrize(("src_spec", "dst_spec"), [("gpt-tiny:tp2,pp2,dp2@4x2", "gpt-tiny:tp2,pp1,dp2@2x2"),
                                                    ("gpt-tiny:tp4,pp2,dp1@4x2", "gpt-tiny:tp2,pp2,dp2@4x2")])  # fmt: skip
def test_needs_read_as_columns_give_the_plan_read_from_objects(monkeypatch, src_spec, dst_spec):
    """select-sources reads the diff's needs from its columns (`NeedTable`, holder rows from
    `HolderSets`) and other needs from the objects; both must give the same plan."""
    import attrs

    from tenplex.compiler import dumps_plan
    from tenplex.compiler.passes import lower
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    options = CompileOptions(max_message_bytes=1 << 12, memory_budget_bytes=1 << 14)
    columns = dumps_plan(compile_plan(src, dst, options))
    with_columns = lower.diff
    monkeypatch.setattr(lower, "diff", lambda *a: attrs.evolve(with_columns(*a), table=None))
    assert dumps_plan(compile_plan(src, dst, options)) == columns


@pytest.mark.parametrize(("src_spec", "dst_spec"), [("gpt-tiny:tp2,pp2,dp2@4x2", "gpt-tiny:tp2,pp1,dp2@2x2"),
                                                    ("gpt-tiny:tp4,pp2,dp1@4x2", "gpt-tiny:tp2,pp2,dp2@4x2")])  # fmt: skip
def test_atoms_of_tensors_alike_are_cut_as_each_would_be(monkeypatch, src_spec, dst_spec):
    """select-sources cuts one (host, tensor) group per tensor kind and shape and reuses the
    cut for tensors of that kind; the plan must be the one cut group by group."""
    from tenplex.compiler import dumps_plan
    from tenplex.compiler.passes.atoms import Atoms
    from tenplex.frontends.spec import ptc_from_spec

    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    alike = dumps_plan(compile_plan(src, dst, CompileOptions(max_message_bytes=1 << 12, memory_budget_bytes=1 << 14)))
    one_by_one = Atoms.shape_of_kind
    monkeypatch.setattr(Atoms, "shape_of_kind", lambda self, far, a, b, _: one_by_one(self, far, a, b, None))
    assert dumps_plan(compile_plan(src, dst, CompileOptions(max_message_bytes=1 << 12, memory_budget_bytes=1 << 14))) == alike
