"""Baseline files of ``plan3d regress``: stable, reviewable text of flattened predictions.

A baseline maps case name -> {term: value}, where a value is a float (SI units), an int, a bool
or a string. The text is written by a small deterministic emitter (not a YAML library), so the
same predictions always give the same bytes and a diff in review shows exactly which numbers
moved:

    # header comment
    version: 1
    cases:

      case-a:
        memory.activations: 1.234567891e+10
        ...

Cases and terms are sorted; one blank line starts each case block; floats carry 10
significant digits (``format(x, ".10g")`` with a mantissa dot added so YAML reads them back as
floats); strings are JSON-quoted (a subset of YAML's double-quoted scalars). The text is valid
YAML and is read back with ``yaml.safe_load``.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Union

import numpy as np
import yaml

from .errors import UsageError

Scalar = Union[float, int, bool, str]
Results = dict[str, dict[str, Scalar]]

VERSION = 1
SIGNIFICANT_DIGITS = 10
HEADER = (
    "# plan3d regress baseline: predictions of the cost model for each case of a case file.\n"
    "# Written by `plan3d regress CASES --baseline FILE --update`; do not edit by hand, review\n"
    "# changes as a diff. SI units (bytes, seconds; throughput.model_tflops_per_gpu in TFLOP/s,\n"
    "# mfu/hfu fractions of peak). Keys sorted, floats to 10 significant digits.\n"
)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def format_float(x: float) -> str:
    """``x`` to 10 significant digits in a form YAML 1.1 reads back as a float.

    ``format(x, '.10g')`` with ``.0`` added to a mantissa without a dot (``80`` -> ``80.0``,
    ``1e+16`` -> ``1.0e+16``: PyYAML's float pattern needs the dot); ``.inf``, ``-.inf``, ``.nan``.
    """
    x = float(x)
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    mantissa, e, exponent = format(x, f".{SIGNIFICANT_DIGITS}g").partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (e + exponent if e else "")


def canonical(value: object) -> Scalar:
    """The value as it reads back from a baseline: numpy scalars to Python, floats rounded to the
    10 significant digits written (so a fresh evaluation compares equal to its own baseline).

    Raises TypeError for anything that is not a bool, int, float or str.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        x = float(value)
        return float(format(x, f".{SIGNIFICANT_DIGITS}g")) if math.isfinite(x) else x
    if isinstance(value, str):
        return value
    raise TypeError(f"baseline values are numbers, booleans or strings, not {type(value).__name__}")


def format_value(value: Scalar) -> str:
    """One scalar as baseline text: true/false, an int, a float (format_float), a JSON string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    return json.dumps(value, ensure_ascii=True)


def _key(key: str) -> str:
    """A mapping key: plain when YAML reads it back as the same string, else JSON-quoted."""
    if _PLAIN_KEY.fullmatch(key) and yaml.safe_load(key) == key:
        return key
    return json.dumps(key, ensure_ascii=True)


def dumps(results: Results) -> str:
    """Baseline text of ``results`` (case -> term -> value); deterministic, sorted, one block per case."""
    lines = [HEADER.rstrip("\n"), f"version: {VERSION}", "cases:" if results else "cases: {}"]
    for case in sorted(results):
        terms = results[case]
        lines.append("")
        if not terms:
            lines.append(f"  {_key(case)}: {{}}")
            continue
        lines.append(f"  {_key(case)}:")
        for term in sorted(terms):
            lines.append(f"    {_key(term)}: {format_value(canonical(terms[term]))}")
    return "\n".join(lines) + "\n"


def loads(text: str, origin: str) -> Results:
    """Parse baseline text; UsageError (one line naming ``origin``) if it is not a baseline."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageError(f"{origin}: malformed baseline YAML{where}") from None
    if not isinstance(data, dict) or "cases" not in data:
        raise UsageError(f"{origin}: not a plan3d regress baseline (no 'cases' mapping)")
    if data.get("version") != VERSION:
        raise UsageError(f"{origin}: baseline version {data.get('version')!r} is not {VERSION}; "
                         "regenerate it with --update")
    cases = data["cases"] or {}
    if not isinstance(cases, dict):
        raise UsageError(f"{origin}: 'cases' must be a mapping of case name -> terms")
    results: Results = {}
    for name, terms in cases.items():
        terms = terms or {}
        if not isinstance(terms, dict) or not all(
                isinstance(v, (bool, int, float, str)) for v in terms.values()):
            raise UsageError(f"{origin}: case {name!r} must map term names to numbers, booleans or strings")
        results[str(name)] = {str(k): canonical(v) for k, v in terms.items()}
    return results


def read(path: Path) -> Results:
    """Load a baseline file (UsageError if unreadable or malformed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    return loads(text, str(path))


def write(path: Path, results: Results) -> None:
    """Write ``results`` to ``path`` atomically (a temporary file in the same folder, then rename)."""
    text = dumps(results)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write baseline {path}: {exc.strerror or exc}") from None
