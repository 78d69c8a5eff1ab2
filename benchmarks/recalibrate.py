"""Recalibrate the shipped hardware profiles on the shipped measured runs, reproducibly.

Each profile of benchmarks/calibration.yaml (dgx-a100-80g, dgx-a100-40g, dgx-h100, dgx-b200,
gb200-nvl72) is refitted from the priors written there, on the runs written there (shipped
datasets, trust tag, globs left out), with ``planner.fidelity.calibrate.fit`` -- what
``plan3d calibrate`` runs, matmul_fp8 included where the GPU has FP8 -- and its ``efficiency:``
block is rewritten in place; the rest of the file (comments, sources, links) is kept. The
profiles without runs of their own follow dgx-h100 as their sources say: dgx-h200 (matmul_fp8
scaled by the measured FP8 MAMF ratio) and hgx-h800 unchanged. A plan may fit only some
factors (``fitted``) and take the others from another profile's fresh fit (``priors_from``):
grand-teton-h100 fits matmul and matmul_fp8 on the torchtitan runs, the rest are dgx-h100's.

Run it after a change to the cost model moves the fitted factors, then review ``git diff
hardware_profiles/`` and regenerate the golden baseline (README, "Regression baseline").
``--check`` only reports whether the shipped factors are what a fresh fit gives (exit 1 if not).

    python benchmarks/recalibrate.py [--check] [--no-loo]
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from planner import catalog
from planner.fidelity.calibrate import FACTORS, FitResult, factors_of, fit, with_factors
from planner.fidelity.loso import ProfilePlan, calibration_plan, fit_set, prior_profile
from planner.fidelity.runs import DATASETS, load_datasets

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "hardware_profiles"
# H200 FP8: maximum achievable FP8 matmul 1453.4 vs H100's 1402.6 TFLOP/s, both of 1979
# (stas00/ml-engineering @744d01e MAMF table, fp8_hardware.md 5.3); BF16 "same as H100".
H200_FP8_RATIO = 1453.4 / 1402.6


def _fmt(key: str, value: float) -> str:
    if key == "step_overhead":
        return f"{value * 1e3:.1f} ms"
    if key == "matmul_half_flops":
        return f"{value:.2e}".replace("e+0", "e+")
    return f"{value:.3f}"


def _block(factors: dict[str, float], source: str) -> str:
    lines = ["efficiency:"] + [f"  {k}: {_fmt(k, factors[k])}" for k in FACTORS if k in factors]
    lines.append("  source: >-")
    # no breaks inside run ids (YAML's >- folds a line break into a space)
    lines += ["    " + line for line in textwrap.wrap(source, width=96, break_on_hyphens=False,
                                                     break_long_words=False)]
    return "\n".join(lines) + "\n"


def _rounded(factors: dict[str, float]) -> dict[str, float]:
    """The factors as written to the YAML (what the shipped profile will actually hold)."""
    return {k: float(_fmt(k, v).split()[0]) * (1e-3 if k == "step_overhead" else 1.0)
            for k, v in factors.items()}


def _calibrated_source(name: str, result: FitResult, plan: ProfilePlan) -> str:
    mean, worst = result.fit_stats
    lmean, lworst = result.loo_stats
    loo = (f"; leave-one-out mean |err| {100 * lmean:.1f}%, max {100 * lworst:.1f}%"
           if result.loo_errors else "")
    priors = ", ".join(f"{k} {v:g}" for k, v in plan.priors.items() if k != "step_overhead")
    if plan.fitted is not None:
        kept = (f"the others are {plan.priors_from}'s fitted factors, carried over"
                if plan.priors_from else "the others are the priors")
        priors = (f"only {', '.join(plan.fitted)} fitted ({kept}), pulled toward "
                  f"{plan.priors_from + chr(39) + 's' if plan.priors_from else 'the priors'} values"
                  + (f"; {priors}" if priors else ""))
    trust = f" --min-trust {plan.min_trust}" if plan.min_trust else ""
    exclude = "".join(f" --exclude '{g}'" for g in plan.exclude)
    warn = (" Fit findings: " + "; ".join(result.warnings) + ".") if result.warnings else ""
    return (f"CALIBRATED (benchmarks/recalibrate.py, plan benchmarks/calibration.yaml: plan3d "
            f"calibrate on {' + '.join(f'{d}_runs.yaml' for d in plan.datasets)} --hardware <{name} "
            f"with the priors below>{trust}{exclude}): factors fitted (scipy least_squares, "
            f"bounded, weak prior) to {len(result.runs)} measured runs: {', '.join(result.runs)}. "
            f"Fit error of the step time: mean |err| {100 * mean:.1f}%, max {100 * worst:.1f}%{loo}."
            f"{warn} {plan.why_excluded or ''} Priors (weight 0.1 in log space): {priors}. Prior "
            f"sources: {plan.prior_sources}")


def _replace_block(path: Path, block: str) -> bool:
    """Rewrite the efficiency block of ``path`` (the ``efficiency:`` line and the indented lines
    under it, up to a blank line, the next top-level key or the end of the file; the rest of the
    file is kept byte for byte); True if the text changed. SystemExit if there is no block."""
    text = path.read_text(encoding="utf-8")
    new, found = re.subn(r"^efficiency:\n(?:  .*(?:\n|\Z))*", block, text, count=1, flags=re.M)
    if not found:
        raise SystemExit(f"{path}: no 'efficiency:' block to rewrite")
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def _differs(name: str, factors: dict[str, float]) -> bool:
    """Whether the shipped profile's factors are not ``factors`` (to 1e-9 relative)."""
    eff = catalog.resolve_hardware(name).efficiency
    return any(abs(float(getattr(eff, k)) - v) > 1e-9 * max(1.0, abs(v)) for k, v in factors.items())


def _followers(h100: dict[str, float]) -> dict[str, tuple[dict[str, float], str]]:
    """The profiles that take dgx-h100's fitted fractions, with their sources: each factor
    named with the value it inherits and where from."""
    same = ", ".join(f"{k} {_fmt(k, v)}" for k, v in h100.items() if k != "matmul_fp8")
    h200_fp8 = round(h100["matmul_fp8"] * H200_FP8_RATIO, 3)
    origin = ("INHERITED FROM dgx-h100 (hardware_profiles/dgx-h100.yaml efficiency, fitted by "
              "benchmarks/recalibrate.py on the runs benchmarks/calibration.yaml names for dgx-h100 "
              "and its efficiency.source lists)")
    return {
        "dgx-h200": ({**h100, "matmul_fp8": h200_fp8}, (
            f"NOT CALIBRATED ON H200 RUNS (none in the shipped datasets). {origin}: {same} as "
            "dgx-h100's, because the H200 has the same GH100 die, Tensor Cores, NVLink 4 and NDR "
            "NICs (same measured bf16 MAMF, 794.5 of 989 TFLOP/s, stas00/ml-engineering @744d01e); "
            f"matmul_fp8 {h200_fp8} = dgx-h100's {h100['matmul_fp8']:.3f} x the measured FP8 MAMF "
            "ratio 1453.4/1402.6 (fp8_hardware.md 5.3). Its larger and faster HBM enters through "
            "gpu.hbm_capacity and gpu.hbm_bandwidth, not these fractions. Refine with `plan3d "
            "calibrate` on H200 runs.")),
        "hgx-h800": (dict(h100), (
            f"NOT CALIBRATED ON H800 RUNS (none in the shipped datasets). {origin}: all of them "
            f"as dgx-h100's ({same}, matmul_fp8 {h100['matmul_fp8']:.3f}) -- the H800 has the "
            "H100's GH100 die, Tensor Cores and HBM3 (Zhao et al. 2025, arXiv:2505.09343, Sec. "
            "4.1), its NVLink 4 switches and NDR ConnectX-7 NICs; the cut NVLink enters through "
            "intra_node.bandwidth_per_gpu (200 GB/s). DeepSeek's own figures would put nvlink near "
            "0.80 and network near 0.80 (Sec. 4.2-4.3); not fitted here.")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits")
    parser.add_argument("--only", action="append", metavar="PROFILE",
                        help="refit only this profile of the plan (repeatable; the followers of "
                        "dgx-h100 are rewritten from its shipped factors when it is not refitted)")
    args = parser.parse_args(argv)
    plans = calibration_plan()
    if args.only:
        unknown = [n for n in args.only if n not in plans]
        if unknown:
            raise SystemExit(f"--only {unknown[0]}: not a profile of benchmarks/calibration.yaml")
        plans = {n: p for n, p in plans.items() if n in args.only}
    cases = load_datasets(list(DATASETS))
    fitted: dict[str, dict[str, float]] = {}
    differs = []
    for name, plan in plans.items():
        hw = prior_profile(name, plan)
        if plan.priors_from in fitted:  # this run's fresh fit, not the shipped file
            hw = with_factors(hw, {**fitted[plan.priors_from], **plan.priors})
        runs = fit_set(cases, name, plan)
        result = fit(runs, hw, leave_one_out=not args.check and not args.no_loo, only=plan.fitted)
        kept = {k: float(getattr(hw.efficiency, k)) for k in factors_of(hw)}
        fitted[name] = factors = _rounded({**kept, **result.factors})
        mean, worst = result.fit_stats
        print(f"{name}: {len(result.runs)} runs, fit mean {100 * mean:.1f}% max {100 * worst:.1f}%; "
              + ", ".join(f"{k} {_fmt(k, v)}" for k, v in factors.items()))
        for warning in result.warnings:
            print(f"  warning: {warning}")
        if args.check:
            differs += [name] if _differs(name, factors) else []
            continue
        _replace_block(PROFILES / f"{name}.yaml", _block(factors, _calibrated_source(name, result, plan)))
    h100 = fitted.get("dgx-h100") or {k: float(getattr(catalog.resolve_hardware("dgx-h100").efficiency, k))
                                       for k in factors_of(catalog.resolve_hardware("dgx-h100"))}
    for name, (factors, source) in _followers(h100).items():
        if args.check:
            differs += [name] if _differs(name, factors) else []
            continue
        _replace_block(PROFILES / f"{name}.yaml", _block(factors, source))
        print(f"{name}: follows dgx-h100")
    if args.check and differs:
        print(f"not what a fresh fit gives: {', '.join(differs)} (run benchmarks/recalibrate.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
