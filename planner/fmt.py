"""The formatters every printed number goes through: SI values in, text with units out.

Inside plan3d quantities are SI (bytes, seconds, FLOP/s, fractions); these functions are the only
place where they become GiB, ms, TFLOP/s, % or a currency. Each returns one token that a table
never needs to cut (no '…'); widths are those of the numbers themselves.
"""

from __future__ import annotations

import math

from .units import GIB, MIB, format_gib

MINUS = "−"  # U+2212, the sign of a negative difference in tables


def number(x: float, significant: int = 4, grouping: bool = False) -> str:
    """``x`` with ``significant`` significant digits in plain decimal notation (no exponent
    between 1e-4 and 1e15): 0.0113 -> "0.0113", 11.3017 -> "11.30", 123456.7 -> "123457"
    (with ``grouping``: "123,457"). Trailing zeros are kept, so values of one kind line up.
    Outside that range (or for 0 with more digits than sense) scientific notation: "1.234e-07".
    NaN -> "nan", infinities -> "inf" / "-inf".
    """
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude < -4 or magnitude >= 15:
        return f"{x:.{max(significant - 1, 0)}e}"
    decimals = max(significant - 1 - magnitude, 0)
    text = f"{x:,.{decimals}f}" if grouping else f"{x:.{decimals}f}"
    # rounding can add a digit (9.9996 -> "10.000"): drop the extra decimal
    digits = sum(ch.isdigit() for ch in text.lstrip("-0.,"))
    if decimals and digits > significant:
        text = f"{x:,.{decimals - 1}f}" if grouping else f"{x:.{decimals - 1}f}"
    return text


def count(n: float) -> str:
    """A whole count with thousands separators: 253440 -> "253,440"."""
    return f"{n:,.0f}"


def seconds(s: float) -> str:
    """A duration in the unit that reads best: "65.9 ms", "13.57 s", "1.5 h", "3.2 days",
    "14.2 years".

    Below one second milliseconds with one decimal (0 -> "0.0 ms"); below an hour seconds with
    two decimals; then hours, then days below 1,000 days, then Julian years (365.25 days), one
    decimal; from 10,000 years "> 10,000 years" (a run that would not end: a restart longer
    than the time between failures), "never" for an infinite or undefined time. Negative
    durations keep their sign.
    """
    if s != s or s in (float("inf"), float("-inf")):
        return "never"
    if s < 0:
        return "-" + seconds(-s)
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 3600:
        return f"{s:.2f} s"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    if s < 1000 * 86400:
        return f"{s / 86400:.1f} days"
    years = s / YEAR_S
    return f"{years:,.1f} years" if years < 10_000 else "> 10,000 years"


YEAR_S = 365.25 * 86400  # a Julian year, seconds
# the units ``seconds`` picks from, with their length in seconds and the decimals shown
DURATION_UNITS = {"ms": (1e-3, 1), "s": (1.0, 2), "h": (3600.0, 1), "days": (86400.0, 1),
                  "years": (YEAR_S, 1)}
NEVER_S = 10_000 * YEAR_S  # from here a duration prints as a bound: "> 10,000 years"


def _unit_of(s: float) -> str:
    """The unit ``seconds`` writes ``s`` (>= 0) in."""
    if s < 1:
        return "ms"
    if s < 3600:
        return "s"
    if s < 86400:
        return "h"
    return "days" if s < 1000 * 86400 else "years"


def duration_unit(values) -> tuple[str, int]:
    """(unit, decimals) of a column of durations (seconds), one for the whole column: the unit
    ``seconds`` gives its largest value (years only when every value is 1,000 days or more:
    "24.6 days" beside "1,160.9 days", never "0.067 years"), with up to two decimals more than
    that unit's own so its smallest positive value keeps two significant digits ("12.327 s"
    beside "0.015 s"). ("ms", 1) for a column with no positive value."""
    shown = [abs(float(v)) for v in values if v is not None and math.isfinite(v) and v != 0]
    if not shown:
        return "ms", 1
    unit = _unit_of(max(shown))
    if unit == "years" and min(shown) < 1000 * 86400:
        unit = "days"
    scale, digits = DURATION_UNITS[unit]
    smallest = min(shown) / scale
    needed = 1 - math.floor(math.log10(smallest)) if smallest < 10 ** (1 - digits) else digits
    return unit, min(max(digits, needed), digits + 2)


def seconds_in(s: float, unit: tuple[str, int]) -> str:
    """A duration in ``unit`` (unit, decimals) as duration_unit gives it, with thousands
    separators: 12.3273 in ("s", 3) -> "12.327 s", 86400 * 1200 in ("days", 1) ->
    "1,200.0 days"; "never" for an infinite or undefined time, "> N unit" from NEVER_S.
    Negative durations keep their sign."""
    if s != s or s in (float("inf"), float("-inf")):
        return "never"
    if s < 0:
        return "-" + seconds_in(-s, unit)
    name, digits = unit
    scale = DURATION_UNITS[name][0]
    if s >= NEVER_S:
        return f"> {NEVER_S / scale:,.0f} {name}"
    return f"{s / scale:,.{digits}f} {name}"


def seconds_column(values) -> list[str]:
    """Durations of one table column, all in one unit (duration_unit): "13.580 s" over
    "0.432 s" rather than "13.58 s" over "432.2 ms"."""
    unit = duration_unit(values)
    return [seconds_in(float(v), unit) for v in values]


def signed_seconds(s: float, unit: tuple[str, int] | None = None) -> str:
    """A difference of durations with its sign: "+2.09 s", "−253.4 ms" (U+2212 minus);
    ``unit``: in that unit (seconds_in) rather than the one that reads best."""
    shown = seconds(abs(s)) if unit is None else seconds_in(abs(s), unit)
    return ("+" if s >= 0 else MINUS) + shown


def gib(n_bytes: float, digits: int = 1) -> str:
    """Bytes as GiB with a unit: 66140079104 -> "61.6 GiB"."""
    return f"{float(n_bytes) / GIB:.{digits}f} GiB"


def gib_value(n_bytes: float, digits: int = 1) -> str:
    """Bytes as a GiB number without the unit (for a column headed GiB): "61.6"."""
    return f"{float(n_bytes) / GIB:.{digits}f}"


def capacity(n_bytes: float) -> str:
    """An HBM capacity as a GiB number (units.format_gib: whole when it is, else one decimal,
    "79.6" for the H100's 81,559 MiB), so a one-decimal total is never shown against a rounded one."""
    return format_gib(n_bytes)


def binary_bytes(n_bytes: float, significant: int = 4) -> str:
    """Bytes in the binary unit that reads best: "512 B", "3.000 MiB", "61.60 GiB"."""
    value = float(n_bytes)
    for unit, scale in (("TiB", 2.0**40), ("GiB", GIB), ("MiB", MIB), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{number(value / scale, significant)} {unit}"
    return f"{value:,.0f} B"


def bandwidth(bytes_per_s: float, bits: bool = False) -> str:
    """A link bandwidth in decimal units as datasheets write them: 450e9 -> "450 GB/s";
    ``bits``: 50e9 bytes/s -> "400 Gb/s" (network links)."""
    value, unit = (float(bytes_per_s) * 8, "b/s") if bits else (float(bytes_per_s), "B/s")
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:g} {prefix}{unit}"
    return f"{value:g} {unit}"


def params(n: float) -> str:
    """A parameter count as people write it: 174.6B, 1.01T, 125.2M, 5,120."""
    if round(n / 1e12, 2) >= 1:
        value = n / 1e12
        return f"{value:.2f}T" if round(value, 2) < 10 else f"{value:.1f}T"
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if round(n / scale, 1) >= 1:
            return f"{n / scale:.1f}{unit}"
    return f"{n:,.0f}"


def percent(fraction: float | None, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage: 0.486 -> "48.6%"; ``signed``: "+2.1%" / "-5.9%". None or
    NaN (nothing to compare) -> ""."""
    if fraction is None or math.isnan(fraction):
        return ""
    return f"{100 * fraction:{'+' if signed else ''}.{digits}f}%"


def percent_change(rel: float, significant: int = 3) -> str:
    """A relative change as a signed percentage with enough decimals to show it:
    0.01 -> "+1.000%", 1.2345e-6 -> "+0.000123%", -0.25 -> "-25.00%". Never an exponent."""
    pct = 100 * float(rel)
    if pct == 0 or not math.isfinite(pct):
        return f"{pct:+.0f}%" if pct == 0 else f"{pct:+}%"
    magnitude = math.floor(math.log10(abs(pct)))
    decimals = min(max(significant - 1 - magnitude, 0), 12)
    return f"{pct:+.{decimals}f}%"


def tokens_per_s(x: float, unit: bool = False) -> str:
    """A token rate, whole tokens with separators: "231,787" (``unit``: "231,787 tokens/s")."""
    return f"{x:,.0f}" + (" tokens/s" if unit else "")


def tflops(flops_per_s: float, digits: int = 0) -> str:
    """FLOP/s as a TFLOP/s number: 480.7e12 -> "481" (``digits`` decimals)."""
    return f"{flops_per_s / 1e12:.{digits}f}"


def money(amount: float, currency: str) -> str:
    """An amount with its currency code first, as banks write it: "USD 1,234,567"; amounts
    under 100 keep cents ("USD 2.50")."""
    return f"{currency} {amount:,.0f}" if abs(amount) >= 100 else f"{currency} {amount:,.2f}"


def loss(x: float) -> str:
    """A training loss to 12 significant digits, trailing zeros kept: "1.13966857900"."""
    return number(x, 12)


def significant(x: float, digits: int = 4) -> str:
    """``x`` rounded to ``digits`` significant digits, trailing zeros dropped: 0.011301759 ->
    "0.0113", 0.80123 -> "0.8012", 1234.5 -> "1235"."""
    text = number(x, digits)
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def duration_text(s: float, digits: int = 4) -> str:
    """A short duration to ``digits`` significant digits in the unit planner.units reads back:
    0.011301759 -> "11.3 ms", 2.5e-5 -> "25 us", 1.5 -> "1.5 s"."""
    if s == 0:
        return "0 s"
    if abs(s) < 1e-3:
        return f"{significant(s * 1e6, digits)} us"
    if abs(s) < 1:
        return f"{significant(s * 1e3, digits)} ms"
    return f"{significant(s, digits)} s"
