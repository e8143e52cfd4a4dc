"""Plain-text formatting helpers shared by the emitters and `describe`."""

import pytest

from tenplex.compiler.emit.fmt import human_bytes, human_seconds, plural, ratio, table


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (12 << 20, "12.0 MiB"),
                                     (3 * (1 << 30) // 2, "1.5 GiB"), (1 << 50, "1.0 PiB"), (1 << 60, "1024.0 PiB")])  # fmt: skip
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    "s, text", [(0, "0 s"), (5e-10, "0.5 ns"), (1.234e-5, "12.3 us"), (4.567e-3, "4.57 ms"), (2.5, "2.5 s")]
)
def test_human_seconds(s, text):
    assert human_seconds(s) == text


def test_ratio_and_plural():
    assert ratio(3, 2) == "1.500x" and ratio(0, 0) == "1.000x" and ratio(1, 0) == "n/a (bound is 0)"
    assert plural(1, "op") == "1 op" and plural(2, "op") == "2 ops" and plural(0, "copy", "copies") == "0 copies"


def test_table_aligns_numbers_right():
    assert table(["name", "n"], [["a", 1], ["bbb", 100]]) == "  name    n\n  ----  ---\n  a       1\n  bbb   100"
    assert table(["x", "y"], [["1", "22"]], align="rl", indent="") == "x  y\n-  --\n1  22"
