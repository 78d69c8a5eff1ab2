import pytest
from hypothesis import given, strategies as st

from planner.errors import UsageError
from planner.units import format_quantity, parse_quantity


@pytest.mark.parametrize("text, kind, expected", [
    ("80 GiB", "bytes", 80 * 2**30),
    ("141 GB", "bytes", 141e9),
    ("900 GB/s", "bandwidth", 900e9),
    ("400 Gb/s", "bandwidth", 50e9),        # 400 gigabits = 50 gigabytes per second
    ("200Gbps", "bandwidth", 25e9),
    ("3.35 TB/s", "bandwidth", 3.35e12),
    ("10 us", "time", 10e-6),
    ("1.5e3 ms", "time", 1.5),
])
def test_parse_quantity(text, kind, expected):
    assert parse_quantity(text, kind) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("value, kind, why", [
    (80, "bytes", "needs a unit"),
    ("80", "bytes", "needs a unit"),
    ("80 GiB/s", "bytes", "unknown unit"),
    ("900 GB", "bandwidth", "unknown unit"),
    ("-1 GiB", "bytes", "must not be negative"),
    ("lots", "time", "cannot parse"),
    (True, "bytes", "expected a quantity"),
])
def test_parse_quantity_rejects(value, kind, why):
    with pytest.raises(UsageError, match=why):
        parse_quantity(value, kind, "field")


def test_format_picks_short_exact_unit():
    assert format_quantity(80 * 2**30, "bytes") == "80 GiB"
    assert format_quantity(141e9, "bytes") == "141 GB"
    assert format_quantity(50e9, "bandwidth") == "50 GB/s"
    assert format_quantity(20e-6, "time") == "20 us"


@given(st.floats(min_value=1.0, max_value=1e16, allow_nan=False), st.sampled_from(["bytes", "bandwidth", "time"]))
def test_format_parse_round_trip_is_exact(value, kind):
    assert parse_quantity(format_quantity(value, kind), kind) == value


@pytest.mark.parametrize("mib, printed", [
    (81_920, "80"),      # A100 80GB: 81,920 MiB = 80 GiB exactly
    (81_559, "79.6"),    # H100: 81,559 / 1024 = 79.647 GiB
    (143_771, "140.4"),  # H200: 143,771 / 1024 = 140.40 GiB
    (183_359, "179.1"),  # B200: 183,359 / 1024 = 179.06 GiB
])
def test_format_gib_prints_capacities_without_rounding_to_a_whole_number(mib, printed):
    from planner.units import format_gib
    assert format_gib(mib * 2**20) == printed


@given(st.floats(1.0, 1000.0), st.floats(1.0, 1000.0))
def test_format_gib_keeps_order(a, b):
    # a smaller capacity never prints larger, so a fitting total never reads above its capacity
    from planner.units import format_gib
    lo, hi = sorted((a, b))
    assert float(format_gib(lo * 2**30)) <= float(format_gib(hi * 2**30))
