"""Sharding rules -> boxes (`shard`) and ZeRO flat fragments (`flat_fragment`): named cases,
error messages, and an arange oracle for fragments."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.frontends.layout import Layout, Rule, flat_fragment, padded_vocab, shard
from tenplex.ir.box import Box, disjoint_union
from tenplex.ir.errors import IRError, SpecError
from tenplex.ir.tensor import Piece


def rows(a, b, width):
    return Box((a, 0), (b, width))


# name: (shape, rule, tp, rank, vocab multiple, local shape, [(global box, local box)])
CASES = {
    "replicated_tp8": ((6,), Rule.REPLICATED, 8, 5, 128, (6,), [(Box((0,), (6,)), Box((0,), (6,)))]),
    "tp2_rows": ((8, 4), Rule.COLUMN, 2, 1, 128, (4, 4), [(rows(4, 8, 4), rows(0, 4, 4))]),
    "tp4_cols": ((4, 8), Rule.ROW, 4, 2, 128, (4, 2), [(Box((0, 4), (4, 6)), Box((0, 0), (4, 2)))]),
    "column_bias_tp4": ((8,), Rule.COLUMN, 4, 3, 128, (2,), [(Box((6,), (8,)), Box((0,), (2,)))]),
    # docs/conventions.md §2.2, MHA h=8 np=ng=4 hn=2: 24 rows; TP4 rank 1 = [q1, k1, v1] = rows 6..12.
    "qkv_mha_tp4": ((24, 8), Rule.QKV, 4, 1, 128, (6, 8), [(rows(6, 12, 8), rows(0, 6, 8))]),
    # GQA np=4 ng=2 hn=2: 16 rows; TP2 rank 1 = group 1 block; TP4 rank 1 = [k0 v0] = rows 4..8.
    "qkv_gqa_tp2": ((16, 8), Rule.QKV, 2, 1, 128, (8, 8), [(rows(8, 16, 8), rows(0, 8, 8))]),
    "qkv_gqa_tp4": ((16, 8), Rule.QKV, 4, 1, 128, (4, 8), [(rows(4, 8, 8), rows(0, 4, 8))]),
    # docs/conventions.md §2.3, f=8: TP2 r0 = [g0..g3 u0..u3]; TP4 r1 = [g2 g3 u2 u3], r3 = [g6 g7 u6 u7].
    "glu_tp2": (
        (16, 4),
        Rule.GLU,
        2,
        0,
        128,
        (8, 4),
        [(rows(0, 4, 4), rows(0, 4, 4)), (rows(8, 12, 4), rows(4, 8, 4))],
    ),
    "glu_tp4": (
        (16, 4),
        Rule.GLU,
        4,
        1,
        128,
        (4, 4),
        [(rows(2, 4, 4), rows(0, 2, 4)), (rows(10, 12, 4), rows(2, 4, 4))],
    ),
    "glu_tp4_last": (
        (16, 4),
        Rule.GLU,
        4,
        3,
        128,
        (4, 4),
        [(rows(6, 8, 4), rows(0, 2, 4)), (rows(14, 16, 4), rows(2, 4, 4))],
    ),
    "glu_bias_tp2": (
        (16,),
        Rule.GLU,
        2,
        1,
        128,
        (8,),
        [(Box((4,), (8,)), Box((0,), (4,))), (Box((12,), (16,)), Box((4,), (8,)))],
    ),
    # GPT-2 vocab 50257: Vp = 50304 / 50432 / 50688 / 51200 for TP 1/2/4/8.
    "vocab_pad_tp1": ((50257, 16), Rule.VOCAB, 1, 0, 128, (50304, 16), [(rows(0, 50257, 16), rows(0, 50257, 16))]),
    "vocab_pad_tp2_r1": (
        (50257, 16),
        Rule.VOCAB,
        2,
        1,
        128,
        (25216, 16),
        [(rows(25216, 50257, 16), rows(0, 25041, 16))],
    ),
    "vocab_pad_tp4_r3": (
        (50257, 16),
        Rule.VOCAB,
        4,
        3,
        128,
        (12672, 16),
        [(rows(38016, 50257, 16), rows(0, 12241, 16))],
    ),
    "vocab_pad_tp8": ((50257, 16), Rule.VOCAB, 8, 7, 128, (6400, 16), [(rows(44800, 50257, 16), rows(0, 5457, 16))]),
    "vocab_pad_tp8_r0": ((50257, 16), Rule.VOCAB, 8, 0, 128, (6400, 16), [(rows(0, 6400, 16), rows(0, 6400, 16))]),
    "vocab_all_fill_rank": ((100, 4), Rule.VOCAB, 2, 1, 128, (128, 4), []),
    "vocab_bias_bert_tp2": (
        (30522,),
        Rule.VOCAB,
        2,
        1,
        128,
        (15360,),
        [(Box((15360,), (30522,)), Box((0,), (15162,)))],
    ),
    "vocab_small_multiple": ((5, 2), Rule.VOCAB, 2, 1, 4, (4, 2), [(rows(4, 5, 2), rows(0, 1, 2))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shard_cases(name):
    shape, rule, tp, rank, multiple, local, pieces = CASES[name]
    layout = shard(shape, rule, tp, rank, multiple)
    assert layout.shape == local
    assert [(p.global_box, p.local_box) for p in layout.pieces] == pieces


ERRORS = {
    "column_indivisible": (((6, 4), Rule.COLUMN, 4, 0), "column rule: dim 0 of shape [6, 4] is not divisible by tp=4"),
    "qkv_indivisible": (((10, 4), Rule.QKV, 4, 0), "qkv rule: dim 0 of shape [10, 4] is not divisible by tp=4"),
    "row_on_vector": (((8,), Rule.ROW, 2, 0), "row rule splits dim 1, but shape [8] has 1 dims"),
    "row_indivisible": (((4, 6), Rule.ROW, 4, 0), "row rule: dim 1 of shape [4, 6] is not divisible by tp=4"),
    "glu_indivisible": (
        ((12, 4), Rule.GLU, 4, 0),
        "glu rule: dim 0 of shape [12, 4] must be 2·f with f divisible by tp=4",
    ),
    "vocab_scalar": (((), Rule.VOCAB, 2, 0), "vocab rule needs a tensor with a vocabulary dim 0, got a scalar"),
    "rank_outside": (((8, 4), Rule.COLUMN, 2, 2), "tp rank 2 is outside [0, 2)"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_shard_errors(name):
    args, message = ERRORS[name]
    with pytest.raises(SpecError) as e:
        shard(*args)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("vocab", "tp", "padded"),
    [
        (50257, 1, 50304),
        (50257, 2, 50432),
        (50257, 4, 50688),
        (50257, 8, 51200),
        (32000, 4, 32256),
        (151936, 8, 152576),
    ],
)
def test_padded_vocab_table(vocab, tp, padded):
    assert padded_vocab(vocab, tp) == padded


@pytest.mark.parametrize("rule", [Rule.COLUMN, Rule.ROW, Rule.QKV, Rule.GLU, Rule.VOCAB])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_ranks_tile_the_tensor(rule, tp):
    shape = (48, 16) if rule is not Rule.VOCAB else (333, 16)
    boxes = [p.global_box for r in range(tp) for p in shard(shape, rule, tp, r, 8).pieces]
    assert sum(b.volume for b in boxes) == math.prod(shape)
    assert sum(b.volume for b in disjoint_union(boxes)) == math.prod(shape)


# name: (layout, start, stop, [(global box, local box)])
_COL = shard((8, 3), Rule.COLUMN, 2, 1)  # local (4, 3) = global rows 4..8
_GLU = shard((8, 2), Rule.GLU, 2, 1)  # local (4, 2) = [g2 g3 u2 u3] = global rows 2,3,6,7
_VOC = shard((5, 2), Rule.VOCAB, 2, 1, 4)  # local (4, 2): local row 0 = global row 4, rows 1..3 fill
FRAGMENTS = {
    "whole": (_COL, 0, 12, [(rows(4, 8, 3), Box((0,), (12,)))]),
    "partial_rows": (
        _COL, 2, 8,
        [(Box((4, 2), (5, 3)), Box((0,), (1,))), (Box((5, 0), (6, 3)), Box((1,), (4,))), (Box((6, 0), (7, 2)), Box((4,), (6,)))],
    ),
    "glu_spans_halves": (_GLU, 2, 6, [(rows(3, 4, 2), Box((0,), (2,))), (rows(6, 7, 2), Box((2,), (4,)))]),
    "vocab_fill_uncovered": (_VOC, 1, 6, [(Box((4, 1), (5, 2)), Box((0,), (1,)))]),
    "all_fill": (_VOC, 2, 8, []),
    "empty": (_COL, 5, 5, []),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_flat_fragment_cases(name):
    layout, start, stop, pieces = FRAGMENTS[name]
    assert [(p.global_box, p.local_box) for p in flat_fragment(layout, start, stop)] == pieces


def test_flat_fragment_rejects_non_slab_piece():
    layout = Layout((4, 4), (Piece(Box((0, 0), (4, 2)), Box((0, 0), (4, 2))),))
    with pytest.raises(
        IRError, match=r"piece local box \[\[0, 4\], \[0, 2\]\] is not a dim-0 slab of local shape \(4, 4\)"
    ):
        flat_fragment(layout, 0, 16)


def _local_array(shape, layout):
    """The TP-local array of global flat indices (-1 = fill)."""
    index = np.arange(math.prod(shape)).reshape(shape)
    local = np.full(layout.shape, -1)
    for p in layout.pieces:
        local[p.local_box.to_slices()] = index[p.global_box.to_slices()]
    return index, local.ravel()


@st.composite
def fragment_cases(draw):
    rule = draw(st.sampled_from([Rule.REPLICATED, Rule.COLUMN, Rule.ROW, Rule.QKV, Rule.GLU, Rule.VOCAB]))
    tp = draw(st.sampled_from([1, 2, 4]))
    ndim = 2 if rule is Rule.ROW else draw(st.integers(1, 3))
    dims = [draw(st.integers(1, 4)) for _ in range(ndim)]
    dims[0] = draw(st.integers(1, 13)) if rule is Rule.VOCAB else dims[0] * 2 * tp
    if rule is Rule.ROW:
        dims[1] *= tp
    layout = shard(tuple(dims), rule, tp, draw(st.integers(0, tp - 1)), 2)
    n = math.prod(layout.shape)
    start = draw(st.integers(0, n))
    return tuple(dims), layout, start, draw(st.integers(start, n))


@given(fragment_cases())
def test_flat_fragment_matches_arange_oracle(case):
    shape, layout, start, stop = case
    index, flat = _local_array(shape, layout)
    window = flat[start:stop]
    covered = np.zeros(len(window), bool)
    for p in flat_fragment(layout, start, stop):
        a, b = p.local_box.start[0], p.local_box.stop[0]
        assert (index[p.global_box.to_slices()].ravel() == window[a:b]).all()
        assert not covered[a:b].any()
        covered[a:b] = True
    assert (covered == (window >= 0)).all()
