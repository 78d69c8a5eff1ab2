"""Fit a hardware profile's efficiency factors to measured runs (``plan3d calibrate``).

Unknowns: the factors of ``Efficiency`` (matmul, matmul_fp8 where the GPU has FP8, matmul_half_flops,
attention, hbm, nvlink, network, step_overhead), each bounded to a physically meaningful range. Residual per run: log(T_pred / T_meas),
the log ratio of predicted to measured step time implied by the run's headline figure (iteration
time directly; TFLOP/s, MFU and tokens/s inversely, as they are proportional to 1/T). A weak
prior pulls each factor toward the given profile's own value (datasheet / micro-benchmark for a
profile that was never calibrated), so factors that the runs cannot identify stay where the
sources put them:
    minimize  sum_runs log(T_pred/T_meas)^2 + w^2 * sum_factors log(x/x0)^2,   w = PRIOR_WEIGHT.
Solved with scipy.optimize.least_squares (trust-region reflective, bounds). Leave-one-out: refit
without each run (warm-started at the full fit) and predict the run left out. A fitted factor on
its bound, or more than PRIOR_RATIO_WARN from its prior, is a finding (``FitResult.warnings``):
the model misses something the factor absorbs, it is not a value to ship silently.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from ..specs import Efficiency, HardwareProfile
from .compare import Comparison, compare
from .runs import RunCase

FACTORS = ("matmul", "matmul_fp8", "matmul_half_flops", "attention", "hbm", "nvlink", "network",
           "step_overhead")
BOUNDS = {"matmul": (0.3, 1.0), "matmul_fp8": (0.2, 1.0), "matmul_half_flops": (1e7, 1e11),
          "attention": (0.1, 1.0),
          "hbm": (0.2, 1.0), "nvlink": (0.2, 1.0), "network": (0.1, 1.0),
          "step_overhead": (1e-3, 1.0)}
# Prior of a factor the profile leaves at 0 (T_misc): 10 ms, weakly held like the others.
PRIOR_FLOOR = {"step_overhead": 1e-2}
PRIOR_WEIGHT = 0.1
PRIOR_RATIO_WARN = 2.0  # a fitted factor this far (either way) from its prior is reported
TIME_LIKE = {"iteration_s"}


def factors_of(hw: HardwareProfile) -> tuple[str, ...]:
    """The factors a profile has: FACTORS without matmul_fp8 where the GPU has no FP8 (None)."""
    return tuple(k for k in FACTORS if getattr(hw.efficiency, k) is not None)


@dataclass
class FitResult:
    """Fitted factors, per-run relative errors of the headline figure at the fit and left out."""

    factors: dict[str, float]
    runs: list[str]
    fit_errors: dict[str, float]
    loo_errors: dict[str, float]
    prior: dict[str, float] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """One line per fitted factor on its bound (within 1%) or more than PRIOR_RATIO_WARN
        from its prior: what the runs pushed a factor to, which the model should explain."""
        out = []
        for key, value in self.factors.items():
            lo, hi = BOUNDS[key]
            if value <= lo * 1.01 or value >= hi / 1.01:
                out.append(f"{key} {value:.4g} is on its bound ({lo:g}..{hi:g})")
            base = max(self.prior.get(key, value), PRIOR_FLOOR.get(key, 0.0))
            if base > 0 and max(value / base, base / value) > PRIOR_RATIO_WARN:
                out.append(f"{key} {value:.4g} is {max(value / base, base / value):.1f}x from its "
                           f"prior {base:.4g}")
        return out

    @staticmethod
    def _stats(errors: dict[str, float]) -> tuple[float, float]:
        vals = np.abs(np.array(list(errors.values()), dtype=float))
        return (float(vals.mean()), float(vals.max())) if vals.size else (float("nan"), float("nan"))

    @property
    def fit_stats(self) -> tuple[float, float]:
        """(mean |error|, max |error|) at the fitted factors."""
        return self._stats(self.fit_errors)

    @property
    def loo_stats(self) -> tuple[float, float]:
        """(mean |error|, max |error|) of each run predicted by a fit without it."""
        return self._stats(self.loo_errors)


def with_factors(hw: HardwareProfile, factors: dict[str, float], source: str | None = None) -> HardwareProfile:
    """A copy of ``hw`` with efficiency factors replaced (and ``efficiency.source`` if given)."""
    eff = hw.efficiency.model_dump(mode="json")  # quantities as strings with units
    eff.update({k: (f"{v!r} s" if k == "step_overhead" else v) for k, v in factors.items()})
    if source is not None:
        eff["source"] = source
    return hw.model_copy(update={"efficiency": Efficiency.model_validate(eff)})


def _to_x(factors: dict[str, float], keys: tuple[str, ...]) -> np.ndarray:
    return np.array([np.log(max(factors[k], PRIOR_FLOOR.get(k, 0.0))) for k in keys])


def _from_x(x: np.ndarray, keys: tuple[str, ...]) -> dict[str, float]:
    return {k: float(np.exp(v)) for k, v in zip(keys, x)}


def _log_time_ratio(c: Comparison) -> float:
    """log(T_pred / T_meas) implied by the headline figure."""
    return float(np.log(c.time_ratio))


def usable(cases: list[RunCase], hw: HardwareProfile) -> list[RunCase]:
    """The non-skipped runs on hardware ``hw.name`` that have a headline figure."""
    return partition(cases, hw)[0]


def partition(cases: list[RunCase], hw: HardwareProfile) -> tuple[list[RunCase], dict[str, str]]:
    """(runs a fit of ``hw`` uses, {id: why not} for the others): skipped by the loader, on
    another hardware profile, or with no headline figure (PRIMARY_ORDER of compare.py: iteration
    time, TFLOP/s or MFU under a known FLOP convention, tokens/s)."""
    keep, unused = [], {}
    for c in cases:
        if c.skipped is not None:
            unused[c.id] = f"not comparable ({c.skipped})"
        elif c.hardware is None or c.hardware.name != hw.name:
            unused[c.id] = f"other hardware ({c.hardware.name if c.hardware else 'none'})"
        elif compare(c, hw).primary is not None:
            keep.append(c)
        elif c.convention == "none" and {"flops_per_gpu", "mfu", "hfu"} & set(c.measured):
            unused[c.id] = ("no headline figure: TFLOP/s/MFU/HFU without a FLOP convention "
                            "(tag the notes [flops=narayanan|korthikanti|mosaic])")
        else:
            unused[c.id] = "no headline figure (iteration time, tokens/s, TFLOP/s or MFU)"
    return keep, unused


def _keys(hw: HardwareProfile, only: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The factors a fit moves: those of ``hw`` (factors_of), or the ``only`` ones among them
    (the rest stay at the profile's values). UsageError for a name that is not a factor."""
    keys = factors_of(hw)
    if only is None:
        return keys
    unknown = [k for k in only if k not in keys]
    if unknown:
        raise UsageError(f"{unknown[0]!r} is not a factor of {hw.name} to fit (factors: {', '.join(keys)})")
    return tuple(k for k in keys if k in only)


def _solve(cases: list[RunCase], hw: HardwareProfile, x0: np.ndarray, prior: np.ndarray,
           max_nfev: int | None = None, keys: tuple[str, ...] | None = None) -> np.ndarray:
    from scipy.optimize import least_squares

    keys = factors_of(hw) if keys is None else keys
    lo = np.log([BOUNDS[k][0] for k in keys])
    hi = np.log([BOUNDS[k][1] for k in keys])

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = with_factors(hw, _from_x(x, keys))
        runs = [_log_time_ratio(compare(c, trial, time_only=True)) for c in cases]
        return np.concatenate([runs, PRIOR_WEIGHT * (x - prior)])

    start = np.clip(x0, lo + 1e-9, hi - 1e-9)
    return least_squares(residuals, start, bounds=(lo, hi), method="trf", x_scale=1.0,
                         diff_step=1e-3, max_nfev=max_nfev).x


def fit(cases: list[RunCase], hw: HardwareProfile, leave_one_out: bool = True,
        only: list[str] | None = None) -> FitResult:
    """Fit the factors of ``hw`` (all, or the ``only`` ones: the rest stay at ``hw``'s values)
    to ``cases`` (all on that hardware). UsageError if there are none."""
    runs = usable(cases, hw)
    if not runs:
        raise UsageError(f"no usable measured run on hardware {hw.name} to calibrate on")
    keys = _keys(hw, only)
    start = {k: float(getattr(hw.efficiency, k)) for k in keys}
    prior = _to_x(start, keys)
    x = _solve(runs, hw, prior, prior, keys=keys)
    fitted = with_factors(hw, _from_x(x, keys))
    fit_errors = {c.id: float(compare(c, fitted, time_only=True).primary_error) for c in runs}
    loo: dict[str, float] = {}
    if leave_one_out and len(runs) > 1:
        for i, c in enumerate(runs):
            rest = runs[:i] + runs[i + 1:]
            xi = _solve(rest, hw, x, prior, max_nfev=40, keys=keys)
            loo[c.id] = float(compare(c, with_factors(hw, _from_x(xi, keys)), time_only=True).primary_error)
    return FitResult(_from_x(x, keys), [c.id for c in runs], fit_errors, loo, start)


def refit(cases: list[RunCase], hw: HardwareProfile, start: dict[str, float],
          max_nfev: int = 40, only: list[str] | None = None) -> HardwareProfile:
    """``hw`` with its factors refitted to ``cases`` (prior: ``hw``'s own factors; search
    warm-started at ``start``; ``only``: the factors moved, as in fit), without leave-one-out:
    what leave-one-source-out refits use.
    ``hw`` unchanged if no case is usable."""
    runs = usable(cases, hw)
    if not runs:
        return hw
    keys = _keys(hw, only)
    prior = _to_x({k: float(getattr(hw.efficiency, k)) for k in keys}, keys)
    x = _solve(runs, hw, _to_x(start, keys), prior, max_nfev=max_nfev, keys=keys)
    return with_factors(hw, _from_x(x, keys))


_FITTED_ON = re.compile(r"^plan3d calibrate: .*? measured runs of .*?: (.*?)\. Fit error")


def fitted_runs(hw: HardwareProfile) -> set[str]:
    """The run ids a profile written by ``plan3d calibrate`` was fitted on, read back from its
    ``efficiency.source`` (source_text); empty for any other profile."""
    match = _FITTED_ON.match(hw.efficiency.source or "")
    return set(match.group(1).split(", ")) if match else set()


def source_text(result: FitResult, dataset: str) -> str:
    """The ``efficiency.source`` of a calibrated profile: what was fitted on, and how well."""
    mean, worst = result.fit_stats
    text = (f"plan3d calibrate: factors fitted (scipy least_squares, bounded, weak prior toward "
            f"the factors of the --hardware profile it started from) to {len(result.runs)} "
            f"measured runs of {dataset}: "
            f"{', '.join(result.runs)}. Fit error of the headline figure: mean |err| "
            f"{100 * mean:.1f}%, max {100 * worst:.1f}%")
    if result.loo_errors:
        lmean, lworst = result.loo_stats
        text += f"; leave-one-out mean |err| {100 * lmean:.1f}%, max {100 * lworst:.1f}%"
    return text + "."
