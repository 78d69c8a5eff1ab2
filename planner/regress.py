"""Regression of the cost model's predictions: case files, evaluation, flattening, comparison.

A case file is a YAML list of cases; each names a model and a hardware profile the way the CLI
does (catalog name, alias or YAML path; relative paths are taken from the case file's folder),
a GPU count, optional ``framework`` (a framework profile name or file; megatron-core), optional
training fields (TrainingSpec; the model's defaults and the framework's facts otherwise) and either
a ``layout`` (the fields of specs.Layout; ``dp`` defaults to gpus / (tp*pp)) or a ``search``
(``top: K`` plus any SearchOptions pin or bound). ``allow_cross_node_tp: true`` lets a layout or a
search put TP groups across nodes (the "tp within the NVLink domain" rule is waived).

Each case evaluates to a flat mapping term -> value (see ``flatten_estimate``): every memory and
time term, throughput and MFU of estimate_layout, or for a search the counts of the pruning
rules and the full estimate of each of the top K layouts, with their layout. ``status`` is
``ok``, ``no_fit`` (a search in which no layout fits) or ``error`` (the current planner cannot
evaluate the case: unknown model, a layout that breaks a rule, ...), with ``message`` then.
A layout that does not fit is an ``ok`` case whose ``memory.fits`` is false.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import baseline as bl
from .baseline import Results, Scalar
from .errors import NoFitError, UsageError
from .catalog import resolve_framework, resolve_hardware, resolve_model
from .cost.step import estimate_layout
from .files import describe_validation_error, read_yaml
from .frameworks.profile import resolve_training
from .inputs import field_of, training_spec
from .layout import Layout
from .search.check import check_layout
from .search.options import SearchOptions, search_options
from .search.run import search
from .specs import TrainingSpec

STATUS_OK = "ok"
INFORMATIONAL = frozenset({"message"})  # kept in the baseline for the reader, never compared


class Case(BaseModel):
    """One regression case of a case file (schema in the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    hardware: str = "dgx-h100"
    gpus: int
    framework: str = "megatron-core"
    training: dict[str, Any] = Field(default_factory=dict)
    layout: Optional[dict[str, Any]] = None
    search: Optional[dict[str, Any]] = None
    allow_cross_node_tp: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> "Case":
        if (self.layout is None) == (self.search is None):
            raise ValueError("give exactly one of 'layout' or 'search'")
        return self


def load_cases(path: Path) -> list[Case]:
    """Read and check a case file: a non-empty list of cases with unique names (UsageError).

    The shape of each case is checked here, its ``layout`` and ``training`` against the Layout /
    TrainingSpec schemas and its ``search`` options by name (check_case_fields), so a malformed
    entry is a usage error naming the case and field; whether the planner can evaluate it (model
    name, layout rules) is part of the result (status ``error``), not a file error.
    """
    data = read_yaml(path)
    if isinstance(data, dict) and "cases" in data:
        data = data["cases"]
    if not isinstance(data, list) or not data:
        raise UsageError(f"{path}: expected a non-empty YAML list of cases")
    cases: list[Case] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        label = f"{path}: case {i + 1}" + (f" ({item['name']})" if isinstance(item, dict)
                                            and isinstance(item.get("name"), str) else "")
        if not isinstance(item, dict):
            raise UsageError(f"{label}: expected a mapping of fields")
        try:
            case = Case.model_validate(item)
        except ValidationError as exc:
            raise UsageError(f"{label}: {describe_validation_error(exc)}") from None
        try:
            check_case_fields(case)
        except UsageError as exc:
            raise UsageError(f"{label}: {exc}") from None
        if case.name in seen:
            raise UsageError(f"{label}: duplicate case name {case.name!r}")
        seen.add(case.name)
        cases.append(_relative_to(case, path.parent))
    return cases


def check_case_fields(case: Case) -> None:
    """UsageError naming the field when ``case.layout`` or ``case.training`` break their schema
    (Layout / TrainingSpec: a missing, unknown or ill-typed field) or ``case.search`` names an
    unknown option or a bad ``top``. Checked without the model: ``dp`` (gpus / (tp*cp*pp) when
    absent) and the training fields the model supplies get stand-ins of 1 for the schema check."""
    checks = [(TrainingSpec, "training", {"seq_length": 1, "global_batch_size": 1, **case.training})]
    if case.layout is not None:
        checks.insert(0, (Layout, "layout", {"dp": 1, **case.layout}))
    for cls, where, data in checks:
        try:
            cls.model_validate(data)
        except ValidationError as exc:
            raise UsageError(f"{where}.{describe_validation_error(exc)}") from None
    if case.search is not None:
        opts = dict(case.search)
        top = opts.pop("top", 5)
        known = {f.name for f in dataclasses.fields(SearchOptions)} - {"allow_cross_node_tp", "framework"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise UsageError(f"search: unknown option {unknown[0]!r} (known: top, "
                             f"{', '.join(sorted(known))})")
        if not isinstance(top, int) or isinstance(top, bool) or top <= 0:
            raise UsageError(f"search: top must be a positive integer, got {top!r}")


def _relative_to(case: Case, folder: Path) -> Case:
    """Model/hardware file paths relative to the case file's folder (catalog names unchanged)."""
    def fix(name: str) -> str:
        p = Path(name).expanduser()
        if name.endswith((".yaml", ".yml", ".json")) and not p.is_absolute():
            return str(folder / p)
        return name
    return case.model_copy(update={"model": fix(case.model), "hardware": fix(case.hardware)})


# ----------------------------------------------------------------------------- evaluation


def flatten_estimate(d: dict, prefix: str = "", with_layout: bool = False) -> dict[str, Scalar]:
    """One ``Estimate.to_dict`` as flat terms ``memory.*``, ``time.*`` (with ``time.link.*``),
    ``throughput.*``, ``stages.<stage>.*`` (and ``layout.*`` when ``with_layout``), each prefixed
    by ``prefix``; values canonical (baseline.canonical)."""
    groups = ("layout", "memory", "time", "throughput") if with_layout else ("memory", "time", "throughput")
    out: dict[str, Scalar] = {}
    for g in groups:
        for k, v in d[g].items():
            if isinstance(v, dict):
                out.update({f"{prefix}{g}.{k}.{k2}": bl.canonical(v2) for k2, v2 in v.items()})
            else:
                out[f"{prefix}{g}.{k}"] = bl.canonical(v)
    for stage in d.get("stages", []):
        out.update({f"{prefix}stages.{stage['stage']}.{k}": bl.canonical(v)
                    for k, v in stage.items() if k != "stage"})
    return out


def _evaluate(case: Case) -> dict[str, Scalar]:
    """The case's flat terms; its inputs go through the checks every command applies
    (planner.inputs: training, search options; search.check_layout: the layout) and the case's
    framework profile (its facts, then the case's own training fields). UsageError."""
    model = resolve_model(case.model)
    hw = resolve_hardware(case.hardware)
    profile = resolve_framework(case.framework)
    job = training_spec(model, case.training, field_of("training"))
    # the framework's facts, then the case's own training fields over them
    training = training_spec(model, {**resolve_training(job, profile).model_dump(mode="json"),
                                     **case.training}, field_of("training"))
    if case.layout is not None:
        layout = check_layout(model, hw, training, case.gpus, case.layout, case.allow_cross_node_tp,
                              profile)
        return flatten_estimate(estimate_layout(model, hw, training, layout).to_dict(0, raw=True))
    opts = dict(case.search or {})
    top = opts.pop("top", 5)
    if not isinstance(top, int) or isinstance(top, bool) or top <= 0:
        raise UsageError(f"search: top must be a positive integer, got {top!r}")
    opts["allow_cross_node_tp"] = case.allow_cross_node_tp
    opts["framework"] = profile
    result = search(model, hw, training, case.gpus,
                    search_options(hw, training, opts, label=field_of("search"),
                                   model=model))
    ranked = result.ranked
    values: dict[str, Scalar] = {"search.enumerated": int(result.enumerated),
                                 "search.fitting": int(result.fitting)}
    values.update({f"search.pruned.{rule}": int(n) for rule, n in result.pruned.items()})
    width = len(str(top))
    for i in range(min(top, len(ranked))):
        values.update(flatten_estimate(ranked.to_dict(i, raw=True), f"rank{i + 1:0{width}d}.",
                                       with_layout=True))
    return values


def evaluate_case(case: Case) -> dict[str, Scalar]:
    """Flat terms of one case with its ``status``; never raises for a case the planner rejects.

    UsageError (unknown name, invalid layout, ...) -> status ``error``; NoFitError of a search ->
    ``no_fit``; any other exception (a bug in the cost model) -> ``error`` naming it, so one broken
    case cannot hide the others.
    """
    try:
        values = _evaluate(case)
    except NoFitError as exc:
        return {"status": "no_fit", "message": str(exc)}
    except UsageError as exc:
        return {"status": "error", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported per case, see docstring
        return {"status": "error", "message": f"internal error: {type(exc).__name__}: {exc}"}
    values["status"] = STATUS_OK
    return values


def evaluate_cases(cases: list[Case], progress: Callable[[str], None] | None = None) -> Results:
    """case name -> flat terms (evaluate_case) for every case, in order."""
    results: Results = {}
    for case in cases:
        if progress is not None:
            progress(case.name)
        results[case.name] = evaluate_case(case)
    return results


# ----------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Change:
    """One difference between a baseline and a fresh evaluation.

    kind: ``moved`` (a value changed beyond rtol; ``rel`` = |after - before| / |before|, inf when
    before is 0), ``added`` / ``removed`` (a term only in the evaluation / only in the baseline),
    ``status`` (the case's status changed, e.g. now failing; ``message`` says why),
    ``case_added`` / ``case_removed`` (a case only in the case file / only in the baseline).
    """

    case: str
    term: str
    kind: str
    before: Scalar | None = None
    after: Scalar | None = None
    rel: float | None = None
    message: str | None = None


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def relative_change(before: float, after: float) -> float:
    """|after - before| / |before|; 0 when equal (NaN equals NaN), inf when before is 0 or NaN differs."""
    if before == after or (math.isnan(before) and math.isnan(after)):
        return 0.0
    if before == 0 or math.isnan(before) or math.isnan(after):
        return math.inf
    return abs(after - before) / abs(before)


def compare(baseline: Results, current: Results, rtol: float) -> list[Change]:
    """Every difference between ``baseline`` and ``current`` beyond ``rtol``, sorted by case, term.

    Numbers compare by relative change (> rtol is drift); booleans and strings must be equal;
    ``message`` is informational and never compared. A case whose status is not ok on both sides
    compares by status only.
    """
    changes: list[Change] = []
    for case in sorted(set(baseline) | set(current)):
        if case not in current:
            changes.append(Change(case, "(case)", "case_removed", before=baseline[case].get("status")))
            continue
        after = current[case]
        if case not in baseline:
            changes.append(Change(case, "(case)", "case_added", after=after.get("status"),
                                  message=_as_str(after.get("message"))))
            continue
        before = baseline[case]
        s0, s1 = before.get("status"), after.get("status")
        if s0 != s1 or s0 != STATUS_OK:
            if s0 != s1:
                changes.append(Change(case, "status", "status", s0, s1,
                                      message=_as_str(after.get("message"))))
            continue
        for term in sorted((set(before) | set(after)) - INFORMATIONAL):
            if term not in before:
                changes.append(Change(case, term, "added", after=after[term]))
            elif term not in after:
                changes.append(Change(case, term, "removed", before=before[term]))
            else:
                b, a = before[term], after[term]
                if _is_number(b) and _is_number(a):
                    rel = relative_change(float(b), float(a))
                    if rel > rtol:
                        changes.append(Change(case, term, "moved", b, a, rel))
                elif type(b) is not type(a) or b != a:
                    changes.append(Change(case, term, "moved", b, a))
    return changes


def _as_str(v: object) -> str | None:
    return None if v is None else str(v)


@dataclass(frozen=True)
class BaselineDiff:
    """What rewriting a baseline changes, entry by entry (an entry: one term of one case, as the
    file writes it): ``new`` (only in the new baseline), ``changed`` (in both, written
    differently after canonical rounding) and ``removed`` (only in the old one); and the cases:
    ``cases_new`` / ``cases_removed`` (a whole case only in one of them) and ``cases_changed``
    (in both, with an entry new, changed or removed)."""

    new: int = 0
    changed: int = 0
    removed: int = 0
    cases_new: int = 0
    cases_changed: int = 0
    cases_removed: int = 0

    @property
    def entries(self) -> int:
        """Entries that differ at all (new + changed + removed)."""
        return self.new + self.changed + self.removed


def baseline_diff(old: Results, new: Results) -> BaselineDiff:
    """How ``new`` differs from ``old`` (BaselineDiff); a case only in ``new`` counts its
    entries as new, one only in ``old`` its entries as removed."""
    counts = dict.fromkeys(("new", "changed", "removed", "cases_new", "cases_changed",
                            "cases_removed"), 0)
    for case in set(old) | set(new):
        a, b = old.get(case, {}), new.get(case, {})
        added, removed = len(set(b) - set(a)), len(set(a) - set(b))
        changed = sum(1 for t in set(a) & set(b) if bl.format_value(a[t]) != bl.format_value(b[t]))
        counts["new"] += added
        counts["removed"] += removed
        counts["changed"] += changed
        if case not in old:
            counts["cases_new"] += 1
        elif case not in new:
            counts["cases_removed"] += 1
        elif added or removed or changed:
            counts["cases_changed"] += 1
    return BaselineDiff(**counts)


def count_changed(old: Results, new: Results) -> tuple[int, int]:
    """(entries, cases) that differ at all between two baselines: a term added, removed or with a
    different written value (exact, after canonical rounding) counts as one entry."""
    d = baseline_diff(old, new)
    return d.entries, d.cases_new + d.cases_changed + d.cases_removed
