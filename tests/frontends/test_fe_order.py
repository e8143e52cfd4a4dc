"""Rank order: Megatron's (tp fastest, then dp, then pp) unless the spec says `order=`."""

import pytest

from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import SpecError


@pytest.mark.parametrize(
    ("spec", "allocation"),
    [
        pytest.param("gpt-tiny:tp2,pp2,dp2@1x8", {"pp0-tp0": (0, 2), "pp0-tp1": (1, 3), "pp1-tp0": (4, 6), "pp1-tp1": (5, 7)}, id="megatron"),
        pytest.param("gpt-tiny:tp2,pp2,dp2,order=tp-pp-dp@1x8", {"pp0-tp0": (0, 4), "pp0-tp1": (1, 5), "pp1-tp0": (2, 6), "pp1-tp1": (3, 7)}, id="tp_pp_dp"),
        pytest.param("gpt-tiny:tp2,pp2,dp2,order=dp-tp-pp@1x8", {"pp0-tp0": (0, 1), "pp0-tp1": (2, 3), "pp1-tp0": (4, 5), "pp1-tp1": (6, 7)}, id="dp_fastest"),
    ],
)
def test_rank_order_places_partitions(spec, allocation):
    assert dict(ptc_from_spec(spec).allocation.items) == allocation


def test_bad_order_is_a_spec_error():
    with pytest.raises(SpecError, match=r"order='tp-dp' must name tp, dp and pp once each"):
        ptc_from_spec("gpt-tiny:tp2,order=tp-dp@1x4")
