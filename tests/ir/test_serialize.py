"""`tenplex.ptc/1`: strict parsing names the field, canonical printing round-trips, saving is atomic."""

import copy
import json
import os
import re

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.ir import ParseError, Value, dumps, load_ptc, loads, ptc_from_json, ptc_to_json, save_ptc
from tenplex.ir import serialize as serialize_module
from tests.strategies import ptcs

FORMATS_EXAMPLE = """{
  "format": "tenplex.ptc/1",
  "devices": [{"id": 0, "host": "h0"}, {"id": 1, "host": "h0"}],
  "tensors": {"w": {"shape": [8, 4], "dtype": "float32"}},
  "subtensors": {
    "w/tp0": {"tensor": "w", "path": "model/w", "box": [[0, 4], [0, 4]]},
    "w/tp1": {"tensor": "w", "path": "model/w", "shape": [6, 4], "fill": 0,
              "pieces": [{"global": [[4, 8], [0, 4]], "local": [[0, 4], [0, 4]]}]}
  },
  "partitions": {"tp0": {"subtensors": ["w/tp0"], "values": {}}, "tp1": {"subtensors": ["w/tp1"]}},
  "allocation": {"tp0": [0], "tp1": [1]}
}"""

CANONICAL = """{
 "format": "tenplex.ptc/1",
 "devices": [
  {"id": 0, "host": "h0"},
  {"id": 1, "host": "h0"}
 ],
 "tensors": {
  "w": {"shape": [8, 4], "dtype": "float32"}
 },
 "subtensors": {
  "w/tp0": {"tensor": "w", "path": "model/w", "box": [[0, 4], [0, 4]]},
  "w/tp1": {"tensor": "w", "path": "model/w", "shape": [6, 4], "pieces": [{"global": [[4, 8], [0, 4]], "local": [[0, 4], [0, 4]]}]}
 },
 "partitions": {
  "tp0": {"subtensors": ["w/tp0"], "values": {}},
  "tp1": {"subtensors": ["w/tp1"], "values": {}}
 },
 "allocation": {
  "tp0": [0],
  "tp1": [1]
 }
}
"""


def doc() -> dict:
    return json.loads(FORMATS_EXAMPLE)


def mutated(change) -> dict:
    d = doc()
    change(d)
    return d


def setter(*path_and_value):
    *path, key, value = path_and_value

    def change(d):
        for k in path:
            d = d[k]
        d[key] = value

    return change


def deleter(*path):
    *path, key = path

    def change(d):
        for k in path:
            d = d[k]
        del d[key]

    return change


ST1 = ("subtensors", "w/tp1")
PIECE0 = (*ST1, "pieces", 0)

# (change to the formats.md example, field the message names, the message after the field)
INVALID = [
    pytest.param(setter("extra", 1), "document", "unknown key 'extra' (allowed: format, devices", id="unknown_top_key"),
    pytest.param(deleter("allocation"), "document", "missing key 'allocation'", id="missing_top_key"),
    pytest.param(setter("format", "tenplex.ptc/2"), "format", "expected 'tenplex.ptc/1', got 'tenplex.ptc/2'", id="bad_format"),
    pytest.param(setter("format", 1), "format", "expected 'tenplex.ptc/1', got 1", id="format_not_string"),
    pytest.param(setter("devices", {}), "devices", "expected a list of devices, got {}", id="devices_not_list"),
    pytest.param(setter("devices", 0, "gpu", 3), "devices[0]", "unknown key 'gpu' (allowed: id, host)", id="device_unknown_key"),
    pytest.param(deleter("devices", 1, "host"), "devices[1]", "missing key 'host'", id="device_missing_host"),
    pytest.param(setter("devices", 0, "id", -1), "devices[0]", "device id -1 is not a non-negative integer", id="negative_device"),
    pytest.param(setter("devices", 1, "host", ""), "devices[1]", "device 1 has host ''", id="empty_host"),
    pytest.param(setter("devices", 1, "id", 0), "devices", "device ids [0] appear more than once", id="duplicate_device"),
    pytest.param(setter("links", {"nvlink": 1}), "links", "unknown key 'nvlink'", id="links_unknown_key"),
    pytest.param(setter("links", {"network": 0}), "links", "link bandwidth network=0 must be a positive", id="links_zero"),
    pytest.param(setter("links", []), "links", "expected an object, got list", id="links_not_object"),
    pytest.param(setter("tensors", []), "tensors", "expected an object, got []", id="tensors_not_object"),
    pytest.param(setter("tensors", "w", "layout", "C"), "tensors['w']", "unknown key 'layout'", id="tensor_unknown_key"),
    pytest.param(deleter("tensors", "w", "dtype"), "tensors['w']", "missing key 'dtype'", id="tensor_missing_dtype"),
    pytest.param(setter("tensors", "w", 8), "tensors['w']", "expected an object, got int", id="tensor_not_object"),
    pytest.param(setter("tensors", "w", "shape", 8), "tensors['w'].shape", "expected a list of integers, got 8", id="tensor_shape_int"),
    pytest.param(
        setter("tensors", "w", "shape", [8.0, 4]), "tensors['w']", "shape [8.0, 4] must be non-negative integers",
        id="tensor_shape_float",
    ),
    pytest.param(setter("tensors", "w", "dtype", "float33"), "tensors['w']", "unknown dtype 'float33'", id="tensor_bad_dtype"),
    pytest.param(setter("subtensors", []), "subtensors", "expected an object, got []", id="subtensors_not_object"),
    pytest.param(setter(*ST1, "dtype", "f4"), "subtensors['w/tp1']", "unknown key 'dtype'", id="subtensor_unknown_key"),
    pytest.param(
        setter("subtensors", "w/tp0", "shape", [4, 4]), "subtensors['w/tp0']", "unknown key 'shape' (allowed: tensor, path, box, fill)",
        id="box_shorthand_with_shape",
    ),
    pytest.param(deleter(*ST1, "pieces"), "subtensors['w/tp1']", "missing key 'pieces'", id="subtensor_missing_pieces"),
    pytest.param(deleter(*ST1, "path"), "subtensors['w/tp1']", "missing key 'path'", id="subtensor_missing_path"),
    pytest.param(setter(*ST1, "shape", 6), "subtensors['w/tp1'].shape", "expected a list of integers, got 6", id="subtensor_shape_int"),
    pytest.param(
        setter(*ST1, "shape", [-6, 4]), "subtensors['w/tp1']", "shape [-6, 4] must be non-negative integers", id="subtensor_shape_negative"
    ),
    pytest.param(setter(*ST1, "pieces", {}), "subtensors['w/tp1'].pieces", "expected a list of pieces, got {}", id="pieces_not_list"),
    pytest.param(setter(*ST1, "fill", "zero"), "subtensors['w/tp1'].fill", "expected a number, got 'zero'", id="fill_string"),
    pytest.param(setter(*ST1, "fill", True), "subtensors['w/tp1'].fill", "expected a number, got True", id="fill_bool"),
    pytest.param(setter(*ST1, "tensor", 5), "subtensors['w/tp1'].tensor", "expected a tensor name, got 5", id="tensor_not_string"),
    pytest.param(setter(*ST1, "path", None), "subtensors['w/tp1'].path", "expected a path string, got None", id="path_not_string"),
    pytest.param(
        setter("subtensors", "w/tp0", "box", "all"), "subtensors['w/tp0'].box", "expected a list of [start, stop] pairs, got 'all'",
        id="box_not_list",
    ),
    pytest.param(
        setter("subtensors", "w/tp0", "box", [[0, 4, 8]]), "subtensors['w/tp0'].box", "box interval [0, 4, 8] is not a [start, stop] pair",
        id="box_bad_pair",
    ),
    pytest.param(
        setter("subtensors", "w/tp0", "box", [[4, 0], [0, 4]]), "subtensors['w/tp0'].box",
        "box [[4, 0], [0, 4]] has an interval [4, 0) that is negative or reversed", id="box_reversed",
    ),
    pytest.param(
        setter("subtensors", "w/tp0", "box", [[0, 0.5]]), "subtensors['w/tp0'].box", "box coordinate 0.5 is not an integer",
        id="box_float_coordinate",
    ),
    pytest.param(setter(*PIECE0, "offset", 0), "subtensors['w/tp1'].pieces[0]", "unknown key 'offset'", id="piece_unknown_key"),
    pytest.param(deleter(*PIECE0, "local"), "subtensors['w/tp1'].pieces[0]", "missing key 'local'", id="piece_missing_local"),
    pytest.param(setter(*ST1, "pieces", [7]), "subtensors['w/tp1'].pieces[0]", "expected an object, got int", id="piece_not_object"),
    pytest.param(
        setter(*PIECE0, "global", {}), "subtensors['w/tp1'].pieces[0].global", "expected a list of [start, stop] pairs, got {}",
        id="piece_global_not_list",
    ),
    pytest.param(
        setter(*PIECE0, "local", [[0, 4], [4, 0]]), "subtensors['w/tp1'].pieces[0].local",
        "box [[0, 4], [4, 0]] has an interval [4, 0) that is negative or reversed", id="piece_local_reversed",
    ),
    pytest.param(
        setter(*PIECE0, "local", [[0, 3], [0, 4]]), "subtensors['w/tp1'].pieces[0]",
        "piece global box [[4, 8], [0, 4]] has volume 16 but local box [[0, 3], [0, 4]] has 12", id="piece_volume_mismatch",
    ),
    pytest.param(
        setter(*PIECE0, "local", [[0, 4], [0, 2], [0, 2]]), "subtensors['w/tp1'].pieces[0]",
        "differ in extents and the local box is not 1-D", id="piece_extents_mismatch",
    ),
    pytest.param(
        setter(*PIECE0, "local", [[3, 7], [0, 4]]), "subtensors['w/tp1']",
        "sub-tensor 'w/tp1' piece 0 local box [[3, 7], [0, 4]] exceeds local shape (6, 4)", id="local_box_out_of_range",
    ),
    pytest.param(
        setter(*ST1, "pieces", [{"global": [[4, 8], [0, 4]], "local": [[0, 4], [0, 4]]},
                                {"global": [[0, 4], [0, 4]], "local": [[2, 6], [0, 4]]}]),
        "subtensors['w/tp1']", "sub-tensor 'w/tp1' pieces 0 and 1 overlap locally: [[0, 4], [0, 4]] and [[2, 6], [0, 4]]",
        id="local_pieces_overlap",
    ),
    pytest.param(setter("partitions", []), "partitions", "expected an object, got []", id="partitions_not_object"),
    pytest.param(
        setter("partitions", "tp0", "devices", [0]), "partitions['tp0']", "unknown key 'devices' (allowed: subtensors, values)",
        id="partition_unknown_key",
    ),
    pytest.param(deleter("partitions", "tp1", "subtensors"), "partitions['tp1']", "missing key 'subtensors'", id="partition_missing_subtensors"),
    pytest.param(
        setter("partitions", "tp0", "subtensors", "w/tp0"), "partitions['tp0'].subtensors",
        "expected a list of sub-tensor ids, got 'w/tp0'", id="partition_subtensors_not_list",
    ),
    pytest.param(
        setter("partitions", "tp0", "subtensors", ["w/tp0", "w/tp0"]), "partitions['tp0']",
        "partition 'tp0' lists a sub-tensor twice: ['w/tp0', 'w/tp0']", id="partition_duplicate_subtensor",
    ),
    pytest.param(setter("partitions", "tp0", "values", []), "partitions['tp0'].values", "expected an object, got []", id="values_not_object"),
    pytest.param(
        setter("partitions", "tp0", "values", {"it": 5}), "partitions['tp0'].values['it']", "expected an object, got int",
        id="value_not_object",
    ),
    pytest.param(
        setter("partitions", "tp0", "values", {"it": {"value": 1, "kind": "int"}}), "partitions['tp0'].values['it']",
        "unknown key 'kind' (allowed: value, policy)", id="value_unknown_key",
    ),
    pytest.param(
        setter("partitions", "tp0", "values", {"it": {"policy": "sometimes"}}), "partitions['tp0'].values['it']",
        "value policy 'sometimes' is not one of ['replicated', 'per-rank']", id="value_bad_policy",
    ),
    pytest.param(setter("allocation", []), "allocation", "expected an object, got []", id="allocation_not_object"),
    pytest.param(setter("allocation", "tp0", 0), "allocation['tp0']", "expected a list of device ids, got 0", id="allocation_not_list"),
    pytest.param(setter("allocation", "tp0", ["0"]), "allocation['tp0']", "expected integer device ids, got '0'", id="allocation_str_device"),
    pytest.param(setter("allocation", "tp0", [True]), "allocation['tp0']", "expected integer device ids, got True", id="allocation_bool_device"),
    pytest.param(setter("allocation", "tp0", []), "allocation", "partition 'tp0' is allocated to no device", id="allocation_empty"),
    pytest.param(
        setter("allocation", "tp0", [0, 0]), "allocation", "partition 'tp0' is allocated to devices [0, 0] with duplicates",
        id="allocation_duplicate_device",
    ),
    # NUL bytes cut names short in files, C strings and UCX tags
    pytest.param(setter(*ST1, "path", "model/w\x00.npy"), "subtensors['w/tp1'].path", "path 'model/w\\x00.npy' contains a NUL byte", id="path_with_nul"),
    pytest.param(setter(*ST1, "tensor", "w\x00"), "subtensors['w/tp1'].tensor", "tensor name 'w\\x00' contains a NUL byte", id="tensor_ref_with_nul"),
    pytest.param(
        setter("subtensors", "w/tp1\x00", {"tensor": "w", "path": "p", "box": [[0, 1], [0, 1]]}), "subtensors['w/tp1\\x00']",
        "sub-tensor id 'w/tp1\\x00' contains a NUL byte", id="subtensor_id_with_nul",
    ),
    pytest.param(
        setter("tensors", "w\x00", {"shape": [1], "dtype": "float32"}), "tensors['w\\x00']", "tensor name 'w\\x00' contains a NUL byte",
        id="tensor_name_with_nul",
    ),
    pytest.param(
        setter("partitions", "tp\x00", {"subtensors": []}), "partitions['tp\\x00']", "partition id 'tp\\x00' contains a NUL byte",
        id="partition_id_with_nul",
    ),
    pytest.param(
        setter("partitions", "tp0", "values", {"it\x00": {"value": 1}}), "partitions['tp0'].values['it\\x00']",
        "value name 'it\\x00' contains a NUL byte", id="value_name_with_nul",
    ),
    pytest.param(setter("devices", 1, "host", "h\x00"), "devices[1]", "device 1 has host 'h\\x00'; expected a non-empty name without NUL bytes", id="host_with_nul"),
    pytest.param(setter("allocation", "tp\x00", [0]), "allocation['tp\\x00']", "partition id 'tp\\x00' contains a NUL byte", id="allocation_key_with_nul"),
]


def parse_error(document, source: str = "ptc.json") -> str:
    with pytest.raises(ParseError) as info:
        ptc_from_json(document, source)
    return str(info.value)


@pytest.mark.parametrize("change, field, message", INVALID)
def test_invalid_document_names_the_field(change, field, message):
    text = parse_error(mutated(change))
    assert text.startswith(f"ptc.json: {field}: "), text
    assert message in text


# Cross-reference errors: found when the PTC is built, so today they are reported at `document`
# with the field in prose. (change, field the message should name, prose the message has now)
CROSS_REFERENCES = [
    pytest.param(setter(*ST1, "tensor", "v"), "subtensors['w/tp1'].tensor", "sub-tensor 'w/tp1' names unknown tensor 'v'", id="dangling_tensor"),
    pytest.param(
        setter(*PIECE0, "global", [[5, 9], [0, 4]]), "subtensors['w/tp1'].pieces[0].global",
        "sub-tensor 'w/tp1' piece 0 global box [[5, 9], [0, 4]] is outside tensor 'w' of shape (8, 4)", id="global_box_out_of_range",
    ),
    pytest.param(
        setter("subtensors", "w/tp0", "box", [[0, 4]]), "subtensors['w/tp0'].box",
        "sub-tensor 'w/tp0' piece 0 global box [[0, 4]] is outside tensor 'w' of shape (8, 4)", id="box_ndim_mismatch",
    ),
    pytest.param(
        setter("partitions", "tp0", "subtensors", ["w/tp0", "w/tpX"]), "partitions['tp0'].subtensors[1]",
        "partition 'tp0' names unknown sub-tensor 'w/tpX'", id="dangling_subtensor",
    ),
    pytest.param(
        setter("partitions", "tp1", "subtensors", ["w/tp1", "w/tp0"]), "partitions['tp1'].subtensors[1]",
        "sub-tensor 'w/tp0' is in partitions 'tp0' and 'tp1'", id="subtensor_in_two_partitions",
    ),
    pytest.param(
        setter("partitions", "tp1", "subtensors", []), "subtensors['w/tp1']", "sub-tensors ['w/tp1'] belong to no partition",
        id="subtensor_in_no_partition",
    ),
    pytest.param(setter("allocation", "tp9", [0]), "allocation['tp9']", "allocation names unknown partition 'tp9'", id="dangling_partition"),
    pytest.param(deleter("allocation", "tp1"), "allocation", "partition 'tp1' is not allocated to any device", id="partition_unallocated"),
    pytest.param(
        setter("allocation", "tp1", [1, 7]), "allocation['tp1']",
        "partition 'tp1' is allocated to device 7, which is not in the topology", id="device_not_in_topology",
    ),
]


@pytest.mark.parametrize("change, field, message", CROSS_REFERENCES)
def test_cross_reference_error_quotes_the_values(change, field, message):
    text = parse_error(mutated(change))
    assert text.startswith("ptc.json: ") and message in text



@pytest.mark.parametrize("change, field, message", CROSS_REFERENCES)
def test_cross_reference_error_names_the_field(change, field, message):
    assert parse_error(mutated(change)).startswith(f"ptc.json: {field}: ")


def test_references_are_checked_field_by_field_only_when_the_ptc_refuses_them(monkeypatch):
    """A valid document's references are checked once, by the PTC's verifier; the parser's
    field-naming check runs only after that verifier refused the document (and the test above
    shows it still names the field)."""
    calls = []
    real = serialize_module._check_references
    monkeypatch.setattr(serialize_module, "_check_references", lambda *a: calls.append(a) or real(*a))
    ptc_from_json(doc(), "ptc.json")
    assert calls == []
    with pytest.raises(ParseError, match=r"^ptc\.json: allocation\['tp9'\]: "):
        ptc_from_json(mutated(setter("allocation", "tp9", [0])), "ptc.json")
    assert len(calls) == 1


UNCHECKED_TYPES = [
    pytest.param(setter("tensors", "w", "dtype", ["float32"]), "tensors['w'].dtype", id="dtype_list"),
    pytest.param(setter("partitions", "tp0", "subtensors", [["w/tp0"]]), "partitions['tp0'].subtensors[0]", id="subtensor_id_list"),
    pytest.param(setter("partitions", "tp0", "subtensors", [5]), "partitions['tp0'].subtensors[0]", id="subtensor_id_int"),
]



@pytest.mark.parametrize("change, field", UNCHECKED_TYPES)
def test_wrong_types_are_parse_errors_naming_the_field(change, field):
    assert parse_error(mutated(change)).startswith(f"ptc.json: {field}: ")


def test_document_not_an_object():
    assert parse_error([]) == "ptc.json: document: expected an object, got list"


def test_invalid_json_names_the_source():
    with pytest.raises(ParseError, match=re.escape("ckpt/ptc.json: not valid JSON: Expecting")):
        loads("{", "ckpt/ptc.json")


# -- canonical printing and round trips ---------------------------------------------------------


def test_design_example_prints_canonically():
    ptc = loads(FORMATS_EXAMPLE)
    assert dumps(ptc) == CANONICAL
    assert dumps(loads(CANONICAL)) == CANONICAL
    assert loads(CANONICAL) == ptc


def test_noncanonical_spellings_print_canonically():
    d = doc()
    d["subtensors"]["w/tp0"] = {"tensor": "w", "path": "model/w", "shape": [4, 4], "pieces": [{"global": [[0, 4], [0, 4]], "local": [[0, 4], [0, 4]]}]}
    d["partitions"]["tp0"] = {"subtensors": ["w/tp0"], "values": {"it": {"value": 3}}}
    d["links"] = {"device": 1.0e12, "host": 1.5e11, "network": 12.5e9}
    text = dumps(ptc_from_json(d))
    assert '"w/tp0": {"tensor": "w", "path": "model/w", "box": [[0, 4], [0, 4]]}' in text
    assert '"tp0": {"subtensors": ["w/tp0"], "values": {"it": {"value": 3, "policy": "replicated"}}}' in text
    assert '"links"' not in text  # default bandwidths are not printed


@given(ptcs(complete=False))
def test_parse_of_print_is_identity(ptc):
    text = dumps(ptc)
    again = loads(text)
    assert again == ptc
    assert dumps(again) == text
    assert json.loads(text) == ptc_to_json(ptc)


@given(ptcs(complete=False))
def test_box_entries_parse_as_the_checked_path_parses_them(ptc):
    """`box` entries in their plain form skip the per-field checks (`_box_subtensor`): the same
    sub-tensors (fields, pieces, hash) as parsing each field with its checks."""
    root = ptc_to_json(ptc)
    fast = ptc_from_json(copy.deepcopy(root))
    fast_path = serialize_module._box_subtensor
    serialize_module._box_subtensor = lambda sid, node: None  # hypothesis runs it many times: no monkeypatch fixture
    try:
        checked = ptc_from_json(copy.deepcopy(root))
    finally:
        serialize_module._box_subtensor = fast_path
    assert fast == checked
    for a, b in zip(fast.subtensors, checked.subtensors):
        assert (a, a.pieces, a.fill, hash(a)) == (b, b.pieces, b.fill, hash(b))


def test_box_entries_not_plainly_valid_take_the_checked_path():
    """Anything unusual in a `box` entry is left to the checks, which name the field."""
    plain = {"tensor": "w", "path": "model/w", "box": [[0, 4], [0, 4]]}
    assert serialize_module._box_subtensor("w/tp0", plain) is not None
    odd = [{**plain, "box": [[0, 4], [4, 0]]}, {**plain, "box": [[0, True], [0, 4]]}, {**plain, "box": [[0, 4, 5]]},
           {**plain, "path": "a\0b"}, {**plain, "fill": True}, {**plain, "extra": 1}, {**plain, "tensor": 3}]  # fmt: skip
    for node in odd:
        assert serialize_module._box_subtensor("w/tp0", node) is None
    assert serialize_module._box_subtensor("w\0", plain) is None


@given(ptcs())
def test_canonical_text_is_independent_of_key_order(ptc):
    root = ptc_to_json(ptc)
    shuffled = {k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v) for k, v in reversed(list(root.items()))}
    assert dumps(ptc_from_json(copy.deepcopy(shuffled))) == dumps(ptc)


# -- files --------------------------------------------------------------------------------------


def test_save_and_load(tmp_path):
    ptc = loads(FORMATS_EXAMPLE)
    path = tmp_path / "ptc.json"
    save_ptc(ptc, path)
    assert path.read_text() == CANONICAL
    assert load_ptc(path) == ptc
    assert os.listdir(tmp_path) == ["ptc.json"]


def test_load_names_the_file(tmp_path):
    path = tmp_path / "ptc.json"
    path.write_text(json.dumps(mutated(setter("format", "x"))))
    with pytest.raises(ParseError, match=re.escape(f"{path}: format: expected 'tenplex.ptc/1', got 'x'")):
        load_ptc(path)
    with pytest.raises(ParseError, match=re.escape(f"{tmp_path / 'absent.json'}: cannot read: No such file or directory")):
        load_ptc(tmp_path / "absent.json")


class Unserializable:
    pass


def _fail_replace(src, dst):
    raise OSError(28, "No space left on device")


_real_fdopen = os.fdopen


class _FailingFile:
    def __init__(self, fd, mode):
        self._file = _real_fdopen(fd, mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def write(self, text):
        self._file.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")


FAILURES = [
    pytest.param(lambda ptc, mp: ptc_with_value(ptc, Unserializable()), TypeError, id="unserializable_value"),
    pytest.param(lambda ptc, mp: mp.setattr(serialize_module.os, "replace", _fail_replace) or ptc, OSError, id="rename_fails"),
    pytest.param(lambda ptc, mp: mp.setattr(serialize_module.os, "fdopen", _FailingFile) or ptc, OSError, id="disk_full_mid_write"),
]


def ptc_with_value(ptc, value):
    tp0 = attrs.evolve(ptc.partition_map["tp0"], values={"it": Value(value)})
    return attrs.evolve(ptc, partitions=(tp0, ptc.partition_map["tp1"]))


@pytest.mark.parametrize("prepare, error", FAILURES)
def test_failed_save_leaves_the_target_unchanged(tmp_path, monkeypatch, prepare, error):
    path = tmp_path / "ptc.json"
    path.write_text("previous contents")
    ptc = prepare(loads(FORMATS_EXAMPLE), monkeypatch)
    with pytest.raises(error):
        save_ptc(ptc, path)
    monkeypatch.undo()
    assert path.read_text() == "previous contents"
    assert os.listdir(tmp_path) == ["ptc.json"]


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3), max_leaves=8)  # fmt: skip


@given(_JSON)
def test_a_leaf_is_printed_as_json_dumps_prints_it(value):
    """Canonical text's leaves (strings straight to the encoder's string function, anything else
    through one encoder made once) are `json.dumps`'s, non-ASCII text included."""
    assert serialize_module._leaf(value) == json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    assert serialize_module._leaf("ü\x00\"\\/\u2028") == json.dumps("ü\x00\"\\/\u2028", ensure_ascii=False)
