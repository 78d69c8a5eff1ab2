"""Pydantic field types shared by the input schemas (planner.specs, planner.hardware_spec).

A quantity field takes a string with a unit ("80 GiB", "400 Gb/s", "5 us"), parsed strictly by
planner.units into SI (bytes, bytes/s, seconds); a bare number is an error. Dumped as JSON it is
written back in the shortest exact unit form, so a dump reloads to identical numbers.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from .errors import UsageError
from .units import format_quantity, parse_count, parse_quantity


def _wrap_parse(kind: str):
    def parse(value: Any) -> float:
        try:
            return parse_quantity(value, kind, field=None)
        except UsageError as exc:  # pydantic adds the field's full path
            raise ValueError(str(exc)) from None

    return parse


Bytes = Annotated[float, BeforeValidator(_wrap_parse("bytes")),
                  PlainSerializer(lambda v: format_quantity(v, "bytes"), return_type=str, when_used="json")]
Bandwidth = Annotated[float, BeforeValidator(_wrap_parse("bandwidth")),
                      PlainSerializer(lambda v: format_quantity(v, "bandwidth"), return_type=str, when_used="json")]
Seconds = Annotated[float, BeforeValidator(_wrap_parse("time")),
                    PlainSerializer(lambda v: format_quantity(v, "time"), return_type=str, when_used="json")]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]


def _parse_count(value: Any) -> Any:
    """A count written as text ("2T", "300B", or "2e12", which YAML 1.1 reads as a string):
    units.parse_count; a number passes through to the strict float check."""
    if not isinstance(value, str):
        return value
    try:
        return parse_count(value, "count")
    except UsageError as exc:  # pydantic adds the field's full path
        raise ValueError(str(exc).removeprefix("count: ")) from None


# a number of tokens: a number, or text with a K/M/B/T suffix ("2T"); dumped as a number
Count = Annotated[float, BeforeValidator(_parse_count)]


# strict: YAML's "32" is not silently an int, nor "no" a bool; unknown fields are errors;
# allow_inf_nan False: a NaN or infinite number (YAML .nan, .inf) is an error, not a value.
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = STRICT


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"  # usable on a command line: no spaces
