"""Recalibrate the shipped hardware profiles on the shipped measured runs, reproducibly.

Each profile of benchmarks/calibration.yaml (dgx-a100-80g, dgx-a100-40g, dgx-h100,
grand-teton-h100) is refitted from the priors written there, on the runs written there (shipped
datasets, trust tag, globs left out), with ``planner.fidelity.calibrate.fit`` -- what
``plan3d calibrate`` runs -- and its ``efficiency:`` block is rewritten in place; the rest of the
file (comments, sources, links) is kept. A plan may fit only some factors (``fitted``) and take
the others from another profile's fresh fit (``priors_from``): grand-teton-h100 fits matmul and
matmul_fp8 on the torchtitan runs, the rest are dgx-h100's. A profile with FP8 whose plan does not
fit matmul_fp8 (dgx-h100) gets it from its fitted matmul by the measured FP8 / BF16 matmul ratio
(MAMF, fp8_hardware.md 5.4). The profiles without a fit of their own follow dgx-h100 as their
sources say (FOLLOWERS): dgx-h200, hgx-h800, dgx-b200 and gb200-nvl72.

Run it after a change to the cost model moves the fitted factors, then review ``git diff
hardware_profiles/`` and regenerate the golden baseline (docs/regress.md).
``--check`` only reports whether the shipped factors are what a fresh fit gives (exit 1 if not).
``--explore`` fits the plans of benchmarks/calibration_explore.yaml -- fits that were tried and
are not shipped (dgx-h100 on both datasets, dgx-b200 and gb200-nvl72 on their modern runs) -- and
prints their factors and warnings; it writes nothing.

    python benchmarks/recalibrate.py [--check | --explore] [--no-loo] [--only PROFILE]
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
EXPLORE = ROOT / "benchmarks" / "calibration_explore.yaml"
# Maximum achievable matmul (MAMF) in TFLOP/s and the dense peak it is a fraction of, BF16 and FP8
# (pre-quantized per-tensor, torch._scaled_mm): stas00/ml-engineering @744d01e18b79
# compute/accelerator MAMF tables as fp8_hardware.md 5.3 lists them (H200 BF16 "same as H100").
MAMF = {"H100": {"bf16": (794.5, 989), "fp8": (1402.6, 1979)},
        "H200": {"bf16": (794.5, 989), "fp8": (1453.4, 1979)},
        "B200": {"bf16": (1745.0, 2250), "fp8": (3432.5, 4500)},
        "GB200": {"bf16": (1822.0, 2500), "fp8": (3615.6, 5000)}}
# The GPU of each profile whose factors are derived from MAMF ratios.
GPU = {"dgx-h100": "H100", "dgx-h200": "H200", "dgx-b200": "B200", "gb200-nvl72": "GB200"}
# matmul_half_flops of a GPU without a fit: the work of ~1.6 us at its BF16 peak (the A100
# profile's half-efficiency GEMM size in time, formulas.md; calibration.yaml's priors).
HALF_SECONDS = 1.6e-6


def mamf(gpu: str, dtype: str) -> float:
    """MAMF over the dense peak of ``gpu`` in ``dtype`` (a fraction)."""
    achieved, peak = MAMF[gpu][dtype]
    return achieved / peak


def fp8_ratio(gpu: str) -> float:
    """matmul_fp8 / matmul as the MAMF tables give it: (FP8 MAMF / FP8 peak) / (BF16 MAMF / BF16
    peak), fp8_hardware.md 5.4 item 1."""
    return mamf(gpu, "fp8") / mamf(gpu, "bf16")


def _fp8_sentence(gpu: str, matmul: float, fp8: float) -> str:
    (b, bp), (f, fp) = MAMF[gpu]["bf16"], MAMF[gpu]["fp8"]
    return (f"matmul_fp8 {fp8:.3f} = matmul {matmul:.3f} x (FP8 MAMF / FP8 peak) / (BF16 MAMF / BF16 "
            f"peak) = x {f}/{fp} / ({b}/{bp}) = x {fp8_ratio(gpu):.3f} (stas00/ml-engineering "
            f"@744d01e MAMF tables, fp8_hardware.md 5.3-5.4; not fitted to FP8 runs).")


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


def _calibrated_source(name: str, result: FitResult, plan: ProfilePlan, derived: str = "") -> str:
    mean, worst = result.fit_stats
    lmean, lworst = result.loo_stats
    loo = (f"; leave-one-out mean |err| {100 * lmean:.1f}%, max {100 * lworst:.1f}%"
           if result.loo_errors else "")
    priors = ", ".join(f"{k} {v:g}" for k, v in plan.priors.items() if k != "step_overhead")
    if plan.fitted is not None:
        rest = "the others, matmul_fp8 derived as above," if derived else "the others"
        kept = (f"{rest} are {plan.priors_from}'s fitted factors, carried over"
                if plan.priors_from else f"{rest} are the priors")
        priors = (f"only {', '.join(plan.fitted)} fitted ({kept}), pulled toward "
                  f"{plan.priors_from + chr(39) + 's' if plan.priors_from else 'the prior'} values"
                  + (f"; {priors}" if priors else ""))
    trust = f" --min-trust {plan.min_trust}" if plan.min_trust else ""
    exclude = "".join(f" --exclude '{g}'" for g in plan.exclude)
    warn = (" Fit findings: " + "; ".join(result.warnings) + ".") if result.warnings else ""
    return (f"CALIBRATED (benchmarks/recalibrate.py, plan benchmarks/calibration.yaml: plan3d "
            f"calibrate on {' + '.join(f'{d}_runs.yaml' for d in plan.datasets)} --hardware <{name} "
            f"with the priors below>{trust}{exclude}): factors fitted (scipy least_squares, "
            f"bounded, weak prior) to {len(result.runs)} measured runs: {', '.join(result.runs)}. "
            f"Fit error of the step time: mean |err| {100 * mean:.1f}%, max {100 * worst:.1f}%{loo}."
            f"{warn}{(' ' + derived) if derived else ''} {plan.why_excluded or ''} Priors (weight 0.1 "
            f"in log space): {priors}. Prior "
            f"sources: {plan.prior_sources}")


def _replace_block(path: Path, block: str) -> bool:
    """Rewrite the efficiency block of ``path`` (the ``efficiency:`` line and the indented lines
    under it, up to a blank line, the next top-level key or the end of the file; the rest of the
    file is kept byte for byte; the entries of the block that ``block`` does not write, such as
    the all-to-all fractions, are kept); True if the text changed. SystemExit if there is no block."""
    text = path.read_text(encoding="utf-8")
    old = re.search(r"^efficiency:\n(?:  .*(?:\n|\Z))*", text, flags=re.MULTILINE)
    if old is None:
        raise SystemExit(f"{path}: no 'efficiency:' block to rewrite")
    # the entries the fit does not own (a2a_nvlink, a2a_source, ...) are kept, before the source
    written = set(re.findall(r"^  (\w+):", block, flags=re.MULTILINE))
    kept = "".join(m.group(0) for m in re.finditer(r"^  (\w+):.*\n(?:    .*\n)*", old.group(0),
                                                     flags=re.MULTILINE) if m.group(1) not in written)
    block = block.replace("\n  source: >-\n", "\n" + kept + "  source: >-\n", 1)
    new = text[:old.start()] + block + text[old.end():]
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def _differs(name: str, factors: dict[str, float]) -> bool:
    """Whether the shipped profile's factors are not ``factors`` (to 1e-9 relative)."""
    eff = catalog.resolve_hardware(name).efficiency
    return any(abs(float(getattr(eff, k)) - v) > 1e-9 * max(1.0, abs(v)) for k, v in factors.items())


def _followers(h100: dict[str, float]) -> dict[str, tuple[dict[str, float], str]]:
    """The profiles without a fit of their own, from dgx-h100's fitted factors ``h100``, with
    their sources: each factor named with the value it takes and where from."""
    same = ", ".join(f"{k} {_fmt(k, v)}" for k, v in h100.items() if k != "matmul_fp8")
    rest = ", ".join(f"{k} {_fmt(k, h100[k])}" for k in ("attention", "hbm", "nvlink", "network",
                                                         "step_overhead"))
    h200_fp8 = round(h100["matmul_fp8"] * mamf("H200", "fp8") / mamf("H100", "fp8"), 3)
    origin = ("INHERITED FROM dgx-h100 (hardware_profiles/dgx-h100.yaml efficiency, fitted by "
              "benchmarks/recalibrate.py on the runs benchmarks/calibration.yaml names for dgx-h100 "
              "and its efficiency.source lists)")
    out = {
        "dgx-h200": ({**h100, "matmul_fp8": h200_fp8}, (
            f"NOT CALIBRATED ON H200 RUNS (none in the shipped datasets). {origin}: {same} as "
            "dgx-h100's, because the H200 has the same GH100 die, Tensor Cores, NVLink 4 and NDR "
            f"NICs (the same measured bf16 MAMF, {MAMF['H200']['bf16'][0]} of 989 TFLOP/s); "
            f"matmul_fp8 {h200_fp8} = dgx-h100's {h100['matmul_fp8']:.3f} x the measured FP8 MAMF "
            f"ratio {MAMF['H200']['fp8'][0]}/{MAMF['H100']['fp8'][0]} (stas00/ml-engineering "
            "@744d01e, fp8_hardware.md 5.3). Its larger and faster HBM enters through "
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
    for name, gpu, what in (("dgx-b200", "B200", "8 GPUs per host, NVLink 5, ConnectX-7 NICs"),
                            ("gb200-nvl72", "GB200", "72 GPUs in one NVLink 5 domain, 4 per host")):
        peak = catalog.resolve_hardware(name).gpu.peak_tflops["bf16"] * 1e12
        matmul = h100["matmul"] * mamf(gpu, "bf16") / mamf("H100", "bf16")
        factors = {**h100, "matmul": round(matmul, 3), "matmul_fp8": round(matmul * fp8_ratio(gpu), 3),
                   "matmul_half_flops": float(f"{HALF_SECONDS * peak:.2e}")}
        (b, bp), (hb, hbp) = MAMF[gpu]["bf16"], MAMF["H100"]["bf16"]
        out[name] = (factors, (
            f"NOT FITTED ON {gpu} RUNS. {origin}, scaled where the GPU differs: matmul "
            f"{factors['matmul']:.3f} = dgx-h100's {h100['matmul']:.3f} x the ratio of measured "
            f"maximum achievable bf16 matmul fractions, {gpu} {b}/{bp} vs H100 {hb}/{hbp}; "
            + _fp8_sentence(gpu, matmul, factors["matmul_fp8"])
            + f" matmul_half_flops {_fmt('matmul_half_flops', factors['matmul_half_flops'])}: the "
            f"work of ~1.6 us at the {gpu} bf16 peak. {rest}: dgx-h100's ({what}; no {gpu} "
            "micro-benchmark of them read). Why not fitted: a fit on the modern rows of this GPU "
            "(benchmarks/calibration_explore.yaml, python benchmarks/recalibrate.py --explore) puts "
            "factors on their bounds or several times from their priors, absorbing work the cost "
            "model lacks on today's software; so the shipped factors never saw the modern rows, "
            "whose errors in `plan3d accuracy` are held-out errors. Refine with `plan3d calibrate` "
            f"on your measured {gpu} runs."))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    mode.add_argument("--explore", action="store_true",
                      help="fit the plans of benchmarks/calibration_explore.yaml, print, write nothing")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits")
    parser.add_argument("--only", action="append", metavar="PROFILE",
                        help="refit only this profile of the plan (repeatable; the followers of "
                        "dgx-h100 are rewritten from its shipped factors when it is not refitted)")
    args = parser.parse_args(argv)
    plans = calibration_plan(EXPLORE if args.explore else None)
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
        result = fit(runs, hw, leave_one_out=not (args.check or args.explore or args.no_loo),
                     only=plan.fitted)
        kept = {k: float(getattr(hw.efficiency, k)) for k in factors_of(hw)}
        factors = _rounded({**kept, **result.factors})
        derived = ""
        if plan.fitted is not None and "matmul_fp8" in factors and "matmul_fp8" not in plan.fitted \
                and not args.explore:
            factors["matmul_fp8"] = round(factors["matmul"] * fp8_ratio(GPU[name]), 3)
            derived = _fp8_sentence(GPU[name], factors["matmul"], factors["matmul_fp8"])
        fitted[name] = factors
        mean, worst = result.fit_stats
        print(f"{name}: {len(result.runs)} runs, fit mean {100 * mean:.1f}% max {100 * worst:.1f}%; "
              + ", ".join(f"{k} {_fmt(k, v)}" for k, v in factors.items()))
        for warning in result.warnings:
            print(f"  warning: {warning}")
        if args.explore:
            continue
        if args.check:
            differs += [name] if _differs(name, factors) else []
            continue
        _replace_block(PROFILES / f"{name}.yaml",
                       _block(factors, _calibrated_source(name, result, plan, derived)))
    if args.explore:
        return 0
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
