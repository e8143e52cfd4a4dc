"""TensorMeta, Piece and SubTensor: one named case per verifier message, plus layout properties."""

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given

from tenplex.ir import ITEMSIZE, Box, IRError, Piece, SubTensor, TensorMeta, itemsize
from tests.strategies import flat_pieces, ptcs


def box(*pairs):
    return Box.from_list(pairs)


def piece(g, lo):
    return Piece(box(*g), box(*lo))


def sub(shape, *pieces, sid="w/tp0"):
    return SubTensor(sid, "w", "model/w", shape, pieces)


INVALID = [
    pytest.param(
        lambda: TensorMeta("w", (8, 4), "float33"), "unknown dtype 'float33'; known: bfloat16, bool, complex128",
        id="unknown_dtype",
    ),
    pytest.param(lambda: itemsize("f4"), "unknown dtype 'f4'", id="itemsize_of_numpy_code"),
    pytest.param(lambda: TensorMeta("w", (2, -1), "float32"), "shape [2, -1] must be non-negative integers", id="negative_side"),
    pytest.param(lambda: TensorMeta("w", (2.0,), "float32"), "shape [2.0] must be non-negative integers", id="float_side"),
    pytest.param(lambda: TensorMeta("w", (True,), "float32"), "shape [True] must be non-negative integers", id="bool_side"),
    pytest.param(
        lambda: piece([[0, 4]], [[0, 3]]), "piece global box [[0, 4]] has volume 4 but local box [[0, 3]] has 3",
        id="piece_volume_mismatch",
    ),
    pytest.param(
        lambda: piece([[0, 2], [0, 3]], [[0, 3], [0, 2]]),
        "piece global box [[0, 2], [0, 3]] and local box [[0, 3], [0, 2]] differ in extents and the local box is not 1-D",
        id="piece_transposed",
    ),
    pytest.param(
        lambda: piece([[0, 4]], [[0, 2], [0, 2]]),
        "piece global box [[0, 4]] and local box [[0, 2], [0, 2]] differ in extents and the local box is not 1-D",
        id="piece_1d_global_2d_local",
    ),
    pytest.param(lambda: sub((-1,)), "shape [-1] must be non-negative integers", id="subtensor_negative_shape"),
    pytest.param(
        lambda: sub((4, 4), piece([[0, 4]], [[0, 4]])),
        "sub-tensor 'w/tp0' piece 0 local box [[0, 4]] has 1 dims but shape (4, 4) has 2",
        id="local_ndim_mismatch",
    ),
    pytest.param(
        lambda: sub((4, 4), piece([[0, 6], [0, 4]], [[0, 6], [0, 4]])),
        "sub-tensor 'w/tp0' piece 0 local box [[0, 6], [0, 4]] exceeds local shape (4, 4)",
        id="local_box_exceeds_shape",
    ),
    pytest.param(
        lambda: sub((6,), piece([[0, 2]], [[0, 2]]), piece([[2, 5]], [[3, 6]]), piece([[5, 6]], [[6, 7]])),
        "sub-tensor 'w/tp0' piece 2 local box [[6, 7]] exceeds local shape (6,)",
        id="later_piece_exceeds",
    ),
    pytest.param(
        lambda: sub((6,), piece([[0, 2]], [[0, 2]]), piece([[4, 7]], [[1, 4]])),
        "sub-tensor 'w/tp0' pieces 0 and 1 overlap locally: [[0, 2]] and [[1, 4]]",
        id="local_pieces_overlap",
    ),
    pytest.param(
        lambda: sub((), piece([], []), piece([], [])),
        "sub-tensor 'w/tp0' pieces 0 and 1 overlap locally: [] and []",
        id="scalar_pieces_overlap",
    ),
    pytest.param(
        lambda: piece([[0, 2], [0, 2]], [[0, 4]]).to_local(box([0, 1], [0, 1])),
        "region [[0, 1], [0, 1]] of flat piece [[0, 2], [0, 2]] has no local box",
        id="to_local_of_flat_piece",
    ),
    pytest.param(
        lambda: piece([[0, 2], [0, 2]], [[0, 4]]).to_global(box([0, 1])),
        "local region [[0, 1]] of flat piece [[0, 4]] has no global box",
        id="to_global_of_flat_piece",
    ),
    pytest.param(lambda: TensorMeta("w\x00", (2,), "float32"), "tensor name 'w\\x00' contains a NUL byte", id="tensor_name_with_nul"),
    pytest.param(lambda: TensorMeta(7, (2,), "float32"), "tensor name 7 is not a string", id="tensor_name_not_string"),
    pytest.param(lambda: SubTensor("w/tp0", "w", "model/w\x00", (0,), ()), "sub-tensor 'w/tp0' path 'model/w\\x00' contains a NUL byte", id="path_with_nul"),
    pytest.param(lambda: sub((0,), sid="w/\x00tp0"), "sub-tensor id 'w/\\x00tp0' contains a NUL byte", id="subtensor_id_with_nul"),
    pytest.param(lambda: SubTensor("w/tp0", None, "p", (0,), ()), "sub-tensor 'w/tp0' tensor None is not a string", id="subtensor_tensor_none"),
]


@pytest.mark.parametrize("build, message", INVALID)
def test_invalid_tensor_message(build, message):
    with pytest.raises(IRError, match=re.escape(message)):
        build()



def test_non_string_dtype_is_an_irerror():
    with pytest.raises(IRError, match=re.escape("unknown dtype ['float32']")):
        TensorMeta("w", (2,), ["float32"])


VALID = [
    pytest.param(lambda: sub((4, 4), piece([[4, 8], [0, 4]], [[0, 4], [0, 4]])), id="tp_row_shard"),
    pytest.param(lambda: sub((6, 4), piece([[4, 8], [0, 4]], [[0, 4], [0, 4]])), id="padded_rows"),
    pytest.param(
        lambda: sub((4, 4), piece([[0, 2], [0, 4]], [[0, 2], [0, 4]]), piece([[8, 10], [0, 4]], [[2, 4], [0, 4]])),
        id="glu_fused_halves",
    ),
    pytest.param(lambda: sub((10,), *flat_pieces((4, 4), 3, 13)), id="zero_flat_fragment"),
    pytest.param(lambda: sub((), piece([], [])), id="scalar"),
    pytest.param(lambda: sub((1,), piece([], [[0, 1]])), id="scalar_in_flat_buffer"),
    pytest.param(lambda: sub((0, 4)), id="empty_shard"),
]


@pytest.mark.parametrize("build", VALID)
def test_valid_subtensors_tile_their_local_array(build):
    st_ = build()
    check_local_tiling(st_)


def check_local_tiling(st_: SubTensor) -> None:
    """Pieces' local boxes plus fill boxes cover the local array exactly once."""
    count = np.zeros(st_.shape, dtype=int)
    for b in [p.local_box for p in st_.pieces] + st_.fill_boxes():
        count[b.to_slices()] += 1
    assert (count == 1).all()
    assert sum(p.local_box.volume for p in st_.pieces) + sum(b.volume for b in st_.fill_boxes()) == st_.volume


@given(ptcs())
def test_generated_subtensors_tile_their_local_array(ptc):
    for st_ in ptc.subtensors:
        check_local_tiling(st_)
        assert all(not b.empty for b in st_.fill_boxes())



def test_fill_boxes_are_never_empty():
    st_ = sub((4, 4), piece([[0, 0], [0, 1]], [[2, 2], [1, 2]]))
    assert all(not b.empty for b in st_.fill_boxes())


def test_piece_coordinate_maps():
    p = piece([[4, 8], [0, 4]], [[1, 5], [0, 4]])
    assert not p.flat
    assert p.to_local(box([5, 7], [1, 3])) == box([2, 4], [1, 3])
    assert p.to_global(box([2, 4], [1, 3])) == box([5, 7], [1, 3])
    assert piece([[0, 2], [0, 2]], [[0, 4]]).flat


@pytest.mark.parametrize("dtype", sorted(ITEMSIZE))
def test_itemsize_matches_numpy(dtype):
    np_dtype = np.dtype(getattr(ml_dtypes, dtype)) if dtype.startswith(("bfloat", "float8")) else np.dtype(dtype)
    assert itemsize(dtype) == np_dtype.itemsize


def test_tensor_meta_box_and_nbytes():
    meta = TensorMeta("w", (8, 4), "bfloat16")
    assert meta.box == Box((0, 0), (8, 4)) and meta.nbytes == 64
    assert TensorMeta("s", (), "float64").nbytes == 8 == math.prod(()) * 8
