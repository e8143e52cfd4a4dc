"""Value, Partition, Allocation and PTC: one named case per verifier message; completeness."""

import re

import attrs
import numpy as np
import pytest
from hypothesis import given

from tenplex.ir import PTC, Allocation, Box, Device, IRError, Partition, Piece, SubTensor, TensorMeta, Topology, Value
from tests.strategies import ptcs

W = TensorMeta("w", (8, 4), "float32")


def rows(sid: str, start: int, stop: int, tensor: str = "w") -> SubTensor:
    g = Box((start, 0), (stop, 4))
    return SubTensor(sid, tensor, f"model/{tensor}", g.shape, [Piece(g, Box.from_shape(g.shape))])


def make(**changes) -> PTC:
    """The example of docs/formats.md (w split over tp0, tp1 on devices 0, 1 of host h0), with `changes`."""
    fields = dict(
        tensors=(W,),
        subtensors=(rows("w/tp0", 0, 4), rows("w/tp1", 4, 8)),
        partitions=(Partition("tp0", ["w/tp0"]), Partition("tp1", ["w/tp1"])),
        allocation=Allocation({"tp0": [0], "tp1": [1]}),
        topology=Topology((Device(0, "h0"), Device(1, "h0"))),
    )
    fields.update(changes)
    return PTC(**fields)


INVALID = [
    pytest.param(
        lambda: Value(1, "sometimes"), "value policy 'sometimes' is not one of ['replicated', 'per-rank']", id="bad_policy"
    ),
    pytest.param(
        lambda: Partition("tp0", ["w/tp0", "w/tp0"]), "partition 'tp0' lists a sub-tensor twice: ['w/tp0', 'w/tp0']",
        id="partition_duplicate_subtensor",
    ),
    pytest.param(
        lambda: Partition("tp0", [], [("it", Value(1)), ("it", Value(1))]),
        "partition 'tp0' has value names ['it', 'it'] with duplicates",
        id="partition_duplicate_value_name",
    ),
    pytest.param(lambda: Allocation({"tp0": []}), "partition 'tp0' is allocated to no device", id="allocated_nowhere"),
    pytest.param(
        lambda: Allocation({"tp0": [1, 1]}), "partition 'tp0' is allocated to devices [1, 1] with duplicates",
        id="allocated_twice_to_one_device",
    ),
    pytest.param(lambda: make(tensors=(W, W)), "tensor 'w' is defined twice", id="tensor_twice"),
    pytest.param(
        lambda: make(subtensors=(rows("w/tp0", 0, 4), rows("w/tp0", 4, 8))), "sub-tensor 'w/tp0' is defined twice",
        id="subtensor_twice",
    ),
    pytest.param(
        lambda: make(partitions=(Partition("tp0", ["w/tp0"]), Partition("tp0", ["w/tp1"]))),
        "partition 'tp0' is defined twice",
        id="partition_twice",
    ),
    pytest.param(
        lambda: make(subtensors=(rows("w/tp0", 0, 4), rows("w/tp1", 4, 8, tensor="v"))),
        "sub-tensor 'w/tp1' names unknown tensor 'v'",
        id="unknown_tensor",
    ),
    pytest.param(
        lambda: make(subtensors=(rows("w/tp0", 0, 4), rows("w/tp1", 4, 9))),
        "sub-tensor 'w/tp1' piece 0 global box [[4, 9], [0, 4]] is outside tensor 'w' of shape (8, 4)",
        id="global_box_outside_tensor",
    ),
    pytest.param(
        lambda: make(subtensors=(rows("w/tp0", 0, 4), SubTensor("w/tp1", "w", "w", (4,), [Piece(Box((4,), (8,)), Box((0,), (4,)))]))),
        "sub-tensor 'w/tp1' piece 0 global box [[4, 8]] is outside tensor 'w' of shape (8, 4)",
        id="global_box_ndim_mismatch",
    ),
    pytest.param(
        lambda: make(partitions=(Partition("tp0", ["w/tp0", "w/tpX"]), Partition("tp1", ["w/tp1"]))),
        "partition 'tp0' names unknown sub-tensor 'w/tpX'",
        id="dangling_subtensor_id",
    ),
    pytest.param(
        lambda: make(partitions=(Partition("tp0", ["w/tp0"]), Partition("tp1", ["w/tp1", "w/tp0"]))),
        "sub-tensor 'w/tp0' is in partitions 'tp0' and 'tp1'",
        id="subtensor_in_two_partitions",
    ),
    pytest.param(
        lambda: make(partitions=(Partition("tp0", ["w/tp0"]), Partition("tp1", []))),
        "sub-tensors ['w/tp1'] belong to no partition",
        id="subtensor_in_no_partition",
    ),
    pytest.param(
        lambda: make(allocation=Allocation({"tp0": [0], "tp1": [1], "tp9": [0]})),
        "allocation names unknown partition 'tp9'",
        id="allocation_unknown_partition",
    ),
    pytest.param(
        lambda: make(allocation=Allocation({"tp0": [0]})), "partition 'tp1' is not allocated to any device",
        id="partition_unallocated",
    ),
    pytest.param(
        lambda: make(allocation=Allocation({"tp0": [0], "tp1": [1, 7]})),
        "partition 'tp1' is allocated to device 7, which is not in the topology",
        id="device_not_in_topology",
    ),
    pytest.param(
        lambda: make(subtensors=(rows("w/tp0", 0, 4), rows("w/tp1", 6, 8))).check_complete(),
        "PTC is incomplete: tensor 'w' region [[4, 6], [0, 4]] is held by no sub-tensor",
        id="incomplete",
    ),
    pytest.param(lambda: Partition("tp\x00", ()), "partition id 'tp\\x00' contains a NUL byte", id="partition_id_with_nul"),
    pytest.param(lambda: Partition("tp0", ("w\x00",)), "partition 'tp0' sub-tensor id 'w\\x00' contains a NUL byte", id="partition_member_with_nul"),
    pytest.param(lambda: Partition("tp0", (), {"it\x00": Value(1)}), "partition 'tp0' value name 'it\\x00' contains a NUL byte", id="value_name_with_nul"),
    pytest.param(lambda: Partition("tp0", (), {"it": 1}), "partition 'tp0' value 'it' is 1, not a Value", id="value_not_a_value"),
    pytest.param(lambda: Allocation({"tp\x00": [0]}), "allocation partition id 'tp\\x00' contains a NUL byte", id="allocation_key_with_nul"),
    pytest.param(lambda: Allocation({"tp0": ["0"]}), "partition 'tp0' is allocated to device '0', which is not an integer device id", id="allocation_str_device"),
    pytest.param(lambda: Allocation({"tp0": 0}), "partition 'tp0' is allocated to 0; expected a list of device ids", id="allocation_not_a_list"),
]


@pytest.mark.parametrize("build, message", INVALID)
def test_invalid_ptc_message(build, message):
    with pytest.raises(IRError, match=re.escape(message)):
        build()



def test_duplicate_value_names_with_different_values():
    with pytest.raises(IRError, match=re.escape("partition 'tp0' has value names ['it', 'it'] with duplicates")):
        Partition("tp0", [], [("it", Value(1)), ("it", Value(2))])



def test_allocation_rejects_a_partition_listed_twice():
    with pytest.raises(IRError, match="'tp0'"):
        Allocation([("tp0", (0,)), ("tp0", (1,))])


def test_accessors():
    ptc = make(allocation=Allocation({"tp0": [1, 0], "tp1": [1]}))
    assert ptc.partition_of == {"w/tp0": "tp0", "w/tp1": "tp1"}
    assert ptc.devices_of_subtensor("w/tp0") == (1, 0)
    assert ptc.allocation.by_device == {0: ("tp0",), 1: ("tp0", "tp1")}
    assert ptc.allocation.devices == (0, 1)
    assert [s.id for s in ptc.by_tensor["w"]] == ["w/tp0", "w/tp1"]
    assert ptc.nbytes_of(ptc.subtensor_map["w/tp1"]) == 64 and ptc.itemsize("w") == 4
    assert Partition("p", [], {"b": Value(1), "a": Value(None, "per-rank")}).values[0][0] == "a"


def test_collections_are_sorted_so_equal_ptcs_compare_equal():
    a = make()
    b = make(subtensors=tuple(reversed(a.subtensors)), partitions=tuple(reversed(a.partitions)))
    assert a == b and hash(a) == hash(b)
    assert attrs.evolve(a, tensors=(W,)) == a


def coverage(ptc: PTC, name: str) -> np.ndarray:
    count = np.zeros(ptc.tensor_map[name].shape, dtype=int)
    for st_ in ptc.by_tensor[name]:
        for p in st_.pieces:
            count[p.global_box.to_slices()] += 1
    return count


@given(ptcs())
def test_generated_ptcs_are_complete(ptc):
    assert ptc.uncovered() == {}
    ptc.check_complete()


@given(ptcs(complete=False))
def test_uncovered_is_exactly_what_no_subtensor_holds(ptc):
    gaps = ptc.uncovered()
    for meta in ptc.tensors:
        missing = np.zeros(meta.shape, dtype=bool)
        for b in gaps.get(meta.name, []):
            assert not b.empty and not missing[b.to_slices()].any()  # disjoint, non-empty
            missing[b.to_slices()] = True
        assert (missing == (coverage(ptc, meta.name) == 0)).all()
    if gaps:
        with pytest.raises(IRError, match="PTC is incomplete"):
            ptc.check_complete()
    else:
        ptc.check_complete()


def test_with_allocation_swaps_devices_and_rejects_unknown_ones():
    ptc = make()
    swapped = ptc.with_allocation(Allocation({"tp0": [1], "tp1": [0]}))
    assert swapped == make(allocation=Allocation({"tp0": [1], "tp1": [0]}))
    assert swapped.devices_of_subtensor("w/tp0") == (1,) and ptc.devices_of_subtensor("w/tp0") == (0,)
    with pytest.raises(IRError, match="partition 'tp1' is allocated to device 7, which is not in the topology"):
        ptc.with_allocation(Allocation({"tp0": [0], "tp1": [7]}))
    with pytest.raises(IRError, match="partition 'tp1' is not allocated to any device"):
        ptc.with_allocation(Allocation({"tp0": [0]}))
