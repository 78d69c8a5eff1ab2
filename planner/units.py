"""Strict parsing and formatting of quantities with units ("80 GiB", "900 GB/s", "400 Gb/s", "5 us").

Inside plan3d every quantity is SI: bytes, bytes/s, seconds. Conversion happens only here
(YAML parsing) and in planner.render (rendering).
"""

from __future__ import annotations

import re

from .errors import UsageError

MIB = 2.0**20  # bytes in a MiB
GIB = 2.0**30  # bytes in a GiB: the one definition (render and messages show memory in GiB)

# Multipliers to the SI base unit (bytes, bytes/s, seconds). Bits are converted to bytes (/8).
_BYTES = {
    "B": 1.0,
    "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2.0**10, "MiB": MIB, "GiB": GIB, "TiB": 2.0**40,
}
_BITS = {"b": 1.0, "kb": 1e3, "Kb": 1e3, "Mb": 1e6, "Gb": 1e9, "Tb": 1e12}
_TIME = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # divisors
_LONG_TIME = {"min": 60.0, "h": 3600.0, "d": 86400.0}  # multipliers: durations of jobs (deadlines)

# unit -> (multiplier, divisor): value = number * multiplier / divisor (exact where possible).
KINDS: dict[str, dict[str, tuple[float, float]]] = {
    "bytes": {u: (m, 1.0) for u, m in _BYTES.items()},
    "bandwidth": {**{f"{u}/s": (m, 1.0) for u, m in _BYTES.items()},
                  **{f"{u}/s": (m, 8.0) for u, m in _BITS.items()},
                  **{f"{u}ps": (m, 8.0) for u, m in _BITS.items() if u != "b"}},
    "time": {**{u: (1.0, d) for u, d in _TIME.items()},
             **{u: (m, 1.0) for u, m in _LONG_TIME.items()}},
}


def _to_si(number: float, factor: tuple[float, float]) -> float:
    return number * factor[0] / factor[1]


def _from_si(value: float, factor: tuple[float, float]) -> float:
    return value * factor[1] / factor[0]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PATTERN = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-zµ/]*)\s*$")


def parse_quantity(value: object, kind: str, field: str | None = "value") -> float:
    """Parse ``"80 GiB"`` (kind ``bytes``), ``"400 Gb/s"`` (``bandwidth``), ``"5 us"`` (``time``).

    Returns the value in SI base units (bytes, bytes/s, seconds) as a float.
    Raises UsageError (its message prefixed with ``field``, unless None) for a bare number (the unit is required), an unknown unit, a unit of the
    wrong kind, or a negative value. Case matters: "Gb/s" is gigabits, "GB/s" gigabytes.
    """
    prefix = f"{field}: " if field else ""
    units = KINDS[kind]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"{prefix}expected a quantity such as {_example(kind)}, got {value!r}")
    if isinstance(value, (int, float)):
        raise UsageError(f"{prefix}{value!r} needs a unit, e.g. {_example(kind)}")
    match = _PATTERN.match(value)
    if not match:
        raise UsageError(f"{prefix}cannot parse {value!r}; expected e.g. {_example(kind)}")
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        raise UsageError(f"{prefix}{value.strip()!r} needs a unit, e.g. {_example(kind)}")
    if unit not in units:
        known = ", ".join(sorted(units))
        raise UsageError(f"{prefix}unknown unit {unit!r} in {value!r} (known: {known})")
    if number < 0:
        raise UsageError(f"{prefix}{value!r} must not be negative")
    return _to_si(number, units[unit])


_COUNT_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_COUNT = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]?)\s*$")


def parse_count(text: str | None, field: str) -> float | None:
    """A count such as a number of training tokens: a plain number ("2e12", "300000000000") or
    one with a decimal suffix, either case: K (1e3), M (1e6), B or G (1e9), T (1e12), so "2T" is
    2e12 and "300B" 3e11. None (not given) stays None.

    Raises UsageError, prefixed with ``field``, for anything else (another suffix, two numbers,
    text). The caller checks the range (planner.inputs.check_numbers)."""
    if text is None:
        return None
    match = _COUNT.match(str(text))
    suffix = match.group(2).upper() if match else ""
    if not match or (suffix and suffix not in _COUNT_SUFFIXES):
        raise UsageError(f"{field}: cannot read {text!r} as a count; write e.g. 2e12 or 2T "
                         "(suffixes K, M, B, T)")
    return float(match.group(1)) * _COUNT_SUFFIXES.get(suffix, 1.0)


def format_quantity(value: float, kind: str) -> str:
    """Inverse of parse_quantity: the shortest exact unit form (``85899345920`` -> ``"80 GiB"``).

    Exact means ``parse_quantity(format_quantity(v, k), k) == v`` bit for bit.
    """
    preferred = {
        "bytes": ["TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "kB", "B"],
        "bandwidth": ["TB/s", "GB/s", "Gb/s", "MB/s", "B/s"],
        "time": ["s", "ms", "us", "ns"],
    }[kind]
    units = KINDS[kind]
    exact = []
    for unit in preferred:
        scaled = _from_si(value, units[unit])
        text = f"{scaled:.10g}"
        if scaled >= 1 and _to_si(float(text), units[unit]) == value:
            exact.append(f"{text} {unit}")
    if exact:
        return min(exact, key=len)  # ties keep the order of `preferred`
    base = next(u for u in preferred if units[u] == (1.0, 1.0))
    return f"{value!r} {base}"


def format_gib(value: float) -> str:
    """An HBM capacity (bytes) as the GiB number messages and tables print: whole when it is
    within 0.05 of a whole number ("80" for 80 GiB), else one decimal ("79.6" for the H100's
    81,559 MiB, "140.4" for the H200's 143,771 MiB), so it is never rounded to a whole number a
    one-decimal total beside it could exceed or undercut."""
    gib = float(value) / GIB
    return f"{gib:.0f}" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f}"


def _example(kind: str) -> str:
    return {"bytes": "'80 GiB'", "bandwidth": "'900 GB/s' or '400 Gb/s'", "time": "'5 us' or '10 min'"}[kind]
