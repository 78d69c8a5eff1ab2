"""Leave-one-source-out (LOSO) errors: each source predicted by factors fitted without it.

The shipped profiles' factors were fitted on the shipped runs (benchmarks/calibration.yaml says
which, and the priors), so their errors on those runs are in-sample. For every fitted profile and
every source (a run's ``group``) with runs on it, the profile is refitted from its priors on its
calibration runs minus that source's (planner.fidelity.calibrate.refit, warm-started at the
shipped factors) and the source's runs are predicted with it. A run on a profile that is not
fitted (its factors come from another profile's fit, or are priors) is held out already: its
LOSO error is its in-sample error.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from pydantic import Field

from ..files import read_yaml, validate
from ..catalog import resolve_hardware
from ..errors import UsageError
from ..quantities import _Strict
from .calibrate import factors_of, fitted_runs, refit, with_factors
from .compare import compare
from .runs import BENCHMARKS, WHEEL, RunCase, select_runs

PLAN = "calibration.yaml"
LOSO_NFEV = 12  # warm-started refits: a few trust-region steps from the shipped fit


class ProfilePlan(_Strict):
    """How one profile is fitted: the shipped datasets, the minimum trust tag, the run-id globs
    left out, the priors (factor -> value) and their sources."""

    datasets: list[str] = Field(min_length=1)
    min_trust: str | None = None
    exclude: list[str] = []
    priors: dict[str, float]
    prior_sources: str = Field(min_length=1)
    why_excluded: str | None = None
    # the factors the fit moves (default: all of the profile's); the rest keep the prior values
    fitted: list[str] | None = None
    # a profile of the plan whose (fitted) factors are this one's priors, ``priors`` over them
    priors_from: str | None = None


def calibration_plan(path: Path | None = None) -> dict[str, ProfilePlan]:
    """{profile name: ProfilePlan} of benchmarks/calibration.yaml (the repository's, else the
    wheel's). UsageError if missing or malformed."""
    if path is None:
        path = next((p for p in (BENCHMARKS / PLAN, WHEEL / PLAN) if p.is_file()), None)
        if path is None:
            raise UsageError(f"the shipped {PLAN} is missing from this installation")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of profile name -> plan")
    return {name: validate(ProfilePlan, plan, f"{path}: {name}") for name, plan in data.items()}


def prior_profile(name: str, plan: ProfilePlan):
    """The shipped profile ``name`` with its factors set to the plan's priors (what a fit
    starts from and is pulled toward): ``priors`` over, with ``priors_from``, the shipped
    factors of that profile."""
    hw = resolve_hardware(name)
    priors = dict(plan.priors)
    if plan.priors_from is not None:
        base = resolve_hardware(plan.priors_from).efficiency
        priors = {**{k: float(getattr(base, k)) for k in factors_of(hw)}, **priors}
    return with_factors(hw, {k: v for k, v in priors.items() if k in factors_of(hw)})


def fit_set(cases: list[RunCase], name: str, plan: ProfilePlan) -> list[RunCase]:
    """The runs a profile is fitted on: of its datasets, on it, with the trust tag, not excluded."""
    chosen = [c for c in cases if c.dataset.removesuffix("_runs") in plan.datasets
              and c.hardware is not None and c.hardware.name == name and c.skipped is None]
    return select_runs(chosen, plan.exclude, plan.min_trust)


def loso_errors(cases: list[RunCase], plan: dict[str, ProfilePlan] | None = None) -> dict[str, Any]:
    """{run id: step-time error (T_pred/T_meas - 1) predicted without the run's source} for every
    comparable run of ``cases`` (runs on a profile that is not fitted: their in-sample error),
    "__refits__": how many refits were made, and "__in_sample__": the ids of runs on a profile
    ``plan3d calibrate`` fitted on them (calibrate.fitted_runs), whose errors are in-sample."""
    plan = calibration_plan() if plan is None else plan
    out: dict[str, Any] = {}
    refits = 0
    in_sample = []
    for c in cases:
        if c.skipped is None and (c.hardware is None or c.hardware.name not in plan):
            comp = compare(c, time_only=True)
            if comp.primary is not None:
                out[c.id] = comp.step_error
                if c.hardware is not None and c.id in fitted_runs(c.hardware):
                    in_sample.append(c.id)
    for name, p in plan.items():
        on_profile = [c for c in cases if c.skipped is None and c.hardware is not None
                      and c.hardware.name == name]
        if not on_profile:
            continue
        prior = prior_profile(name, p)
        shipped = resolve_hardware(name)
        start = {k: float(getattr(shipped.efficiency, k)) for k in factors_of(prior)
                 if p.fitted is None or k in p.fitted}
        fitted_on = fit_set(cases, name, p)
        for group in dict.fromkeys(c.group for c in on_profile):
            rest = [c for c in fitted_on if c.group != group]
            held = refit(rest, prior, start, max_nfev=LOSO_NFEV, only=p.fitted) \
                if len(rest) < len(fitted_on) else shipped
            refits += len(rest) < len(fitted_on)
            for c in on_profile:
                if c.group == group:
                    comp = compare(c, held, time_only=True)
                    if comp.primary is not None:
                        out[c.id] = comp.step_error
    out["__refits__"] = refits
    out["__in_sample__"] = in_sample
    return out


def excluded(case_id: str, plan: ProfilePlan) -> bool:
    """Whether a run id is left out of a profile's fit by its plan's globs."""
    return any(fnmatch(case_id, g) for g in plan.exclude)
