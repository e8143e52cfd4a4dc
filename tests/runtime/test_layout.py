"""Store layout: every leaf path of a tag parses back into what it was made from, whatever
characters its partition id, value name or sub-tensor id hold (a `/` in a value name, as in
Megatron's `rng_state/shard_0.0_1.2`, once came back split between partition and name)."""

from hypothesis import given
from hypothesis import strategies as st

from tenplex.runtime.store.layout import array_path, parse_leaf, value_path

part = st.text(st.sampled_from("ab0-_.%/"), min_size=1, max_size=8).filter(lambda s: all(c not in ("", ".", "..") for c in s.split("/")))
name = st.lists(st.text(st.sampled_from("xy1_:%"), min_size=1, max_size=5), min_size=1, max_size=3).map("/".join)


@given(part, name, st.integers(0, 99))
def test_a_value_path_parses_into_its_partition_device_and_name(partition, value, device):
    assert parse_leaf("j", "t", value_path("j", "t", device, partition, value)) == ("value", (partition, device, value))


@given(name, st.integers(0, 99))
def test_an_array_path_parses_into_its_subtensor_and_device(sid, device):
    assert parse_leaf("j", "t", array_path("j", "t", device, sid)) == ("array", (sid, device))


def test_megatrons_rng_state_name_keeps_its_slash():
    path = value_path("j", "t", 3, "pp0-tp1", "rng_state/shard_0.0_1.2")
    assert parse_leaf("j", "t", path) == ("value", ("pp0-tp1", 3, "rng_state/shard_0.0_1.2"))
