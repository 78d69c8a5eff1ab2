"""Recalibrate the shipped hardware profiles on the shipped measured runs, reproducibly.

Each calibrated profile (dgx-a100-80g, dgx-a100-40g, dgx-h100) is refitted from the same priors,
on the same runs (trust high, the DeepSpeed ZeRO-3 rows of Narayanan 2021 Table 2 left out) with
``planner.fidelity.calibrate.fit`` -- what ``plan3d calibrate`` runs -- and its ``efficiency:``
block is rewritten in place; the rest of the file (comments, sources, links) is kept. The
profiles without runs of their own follow dgx-h100 as their sources say: dgx-h200 and hgx-h800
take its fractions unchanged (same GH100 die, NVLink 4 parts, NDR NICs), dgx-b200 and gb200-nvl72
the same with matmul scaled by the measured MAMF ratio.

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
from planner.fidelity.calibrate import FACTORS, FitResult, fit, with_factors
from planner.fidelity.runs import load_runs, select_runs

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "hardware_profiles"
EXCLUDE = ["megatron21-t2-zero3-*"]
MIN_TRUST = "high"

# Priors (datasheet / micro-benchmark values) and where each comes from. step_overhead 0: the
# fit starts from calibrate.PRIOR_FLOOR (10 ms).
A100_PRIOR_SOURCES = (
    "matmul: measured maximum achievable bf16 matmul 267.9 of 312 TFLOP/s (stas00/ml-engineering, "
    "compute/accelerator 'Maximum Achievable Matmul FLOPS' table, A100 SXM, CUDA 12.1). "
    "matmul_half_flops: GEMM size at half of that rate, from calculon's A100 efficiency-by-size "
    "curve (0.6 at 1 GFLOP, 0.9 at 16 GFLOP, 0.95 above 128 GFLOP) -> about 0.5 GFLOP, i.e. about "
    "1.6 us of work at peak. attention: FlashAttention-2 paper (Dao 2023) reports 50-73% of peak "
    "forward and lower backward on A100; 0.55 for forward+backward. hbm: measured copy bandwidth is "
    "about 90% of the datasheet figure on recent GPUs; 0.85 for mixed elementwise kernels. nvlink: "
    "nccl-tests all_reduce busbw 230-250 GB/s on 8x A100 SXM4 (alayanew NCCL-tests guide, 2026) "
    "over 300 GB/s. network: calculon's IB efficiency 0.9.")
H100_PRIOR_SOURCES = (
    "matmul: measured maximum achievable bf16 matmul 792.1 of 989 TFLOP/s (stas00/ml-engineering "
    "'Maximum Achievable Matmul FLOPS' table, H100 SXM, CUDA 12.1). matmul_half_flops: the A100 "
    "profile's ~1.6 us of work at peak, scaled to H100's peak. attention: FlashAttention-3 paper "
    "(Shah et al. 2024) reports up to 75% of peak forward, less in backward; 0.55 for "
    "forward+backward. hbm: ~90% measured copy bandwidth, 0.85 for mixed kernels. nvlink: "
    "nccl-tests ring collectives on 8x H100 SXM reach ~360 GB/s busbw (all-reduce with NVLS 460-480 "
    "GB/s, alayanew NCCL-tests guide); 0.80 of 450 GB/s for all kinds. network: calculon's IB "
    "efficiency 0.9.")
CALIBRATED = {
    "dgx-a100-80g": (dict(matmul=0.859, matmul_half_flops=5e8, attention=0.55, hbm=0.85,
                          nvlink=0.78, network=0.9, step_overhead=0.0), A100_PRIOR_SOURCES),
    "dgx-a100-40g": (dict(matmul=0.859, matmul_half_flops=5e8, attention=0.55, hbm=0.85,
                          nvlink=0.78, network=0.9, step_overhead=0.0), A100_PRIOR_SOURCES),
    "dgx-h100": (dict(matmul=0.801, matmul_half_flops=1.6e9, attention=0.55, hbm=0.85,
                      nvlink=0.8, network=0.9, step_overhead=0.0), H100_PRIOR_SOURCES),
}
# B200 matmul: H100's fitted fraction x (B200 MAMF 1745.0/2250 = 77.6%) / (H100 792.1/989 = 80.1%).
B200_MATMUL_RATIO = (1745.0 / 2250) / (792.1 / 989)
B200_HALF_FLOPS = 3.6e9  # ~1.6 us of work at the B200 peak (2250 TFLOP/s)
# GB200 matmul: the same, with GB200's MAMF 1822.0/2500 = 72.9% (stas00/ml-engineering @ 744d01e).
GB200_MATMUL_RATIO = (1822.0 / 2500) / (792.1 / 989)
GB200_HALF_FLOPS = 4.0e9  # ~1.6 us of work at the GB200 peak (2500 TFLOP/s)


def _fmt(key: str, value: float) -> str:
    if key == "step_overhead":
        return f"{value * 1e3:.1f} ms"
    if key == "matmul_half_flops":
        return f"{value:.2e}".replace("e+0", "e+")
    return f"{value:.3f}"


def _block(factors: dict[str, float], source: str) -> str:
    lines = ["efficiency:"] + [f"  {k}: {_fmt(k, factors[k])}" for k in FACTORS]
    lines.append("  source: >-")
    # no breaks inside run ids (YAML's >- folds a line break into a space)
    lines += ["    " + line for line in textwrap.wrap(source, width=96, break_on_hyphens=False,
                                                     break_long_words=False)]
    return "\n".join(lines) + "\n"


def _rounded(factors: dict[str, float]) -> dict[str, float]:
    """The factors as written to the YAML (what the shipped profile will actually hold)."""
    out = {}
    for k, v in factors.items():
        text = _fmt(k, v)
        out[k] = float(text.split()[0]) * (1e-3 if k == "step_overhead" else 1.0)
    return out


def _calibrated_source(name: str, result: FitResult, prior: dict[str, float], prior_sources: str) -> str:
    mean, worst = result.fit_stats
    lmean, lworst = result.loo_stats
    loo = (f"; leave-one-out mean |err| {100 * lmean:.1f}%, max {100 * lworst:.1f}%"
           if result.loo_errors else "")
    priors = ", ".join(f"{k} {v}" for k, v in prior.items() if k != "step_overhead")
    return (f"CALIBRATED (benchmarks/recalibrate.py: plan3d calibrate benchmarks/published_runs.yaml "
            f"--hardware <{name} with the prior factors below> --min-trust {MIN_TRUST} --exclude "
            f"'{EXCLUDE[0]}'): factors fitted (scipy least_squares, bounded, weak prior toward the "
            f"datasheet values) to {len(result.runs)} measured runs of published_runs.yaml: "
            f"{', '.join(result.runs)}. Fit error of the headline figure: mean |err| "
            f"{100 * mean:.1f}%, max {100 * worst:.1f}%{loo}. The DeepSpeed ZeRO-3 rows of "
            f"Narayanan 2021 Table 2 are left out of the fit: their parameter traffic is bound by "
            f"DeepSpeed 0.3's own implementation (21 GB/s per GPU, TrainingSpec.zero3_throughput; "
            f"README, How accurate is it), not by the hardware these factors describe. Priors the fit was "
            f"pulled toward (weight 0.1 in log space), from the sources: {priors}. Prior sources: "
            f"{prior_sources} To be refined by `plan3d calibrate`.")


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
    return any(abs(float(getattr(eff, k)) - factors[k]) > 1e-9 * max(1.0, abs(factors[k]))
               for k in FACTORS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits")
    args = parser.parse_args(argv)
    fitted: dict[str, dict[str, float]] = {}
    differs = []
    for name, (prior, prior_sources) in CALIBRATED.items():
        hw = with_factors(catalog.resolve_hardware(name), prior)
        cases = select_runs(load_runs(), EXCLUDE, MIN_TRUST)
        for c in cases:  # runs on this GPU are predicted with the profile being fitted
            if c.skipped is None and c.hardware is not None and c.hardware.gpu.name == hw.gpu.name:
                c.hardware = hw
        result = fit(cases, hw, leave_one_out=not args.check and not args.no_loo)
        fitted[name] = factors = _rounded(result.factors)
        mean, worst = result.fit_stats
        print(f"{name}: {len(result.runs)} runs, fit mean {100 * mean:.1f}% max {100 * worst:.1f}%; "
              + ", ".join(f"{k} {_fmt(k, v)}" for k, v in factors.items()))
        if args.check:
            if _differs(name, factors):
                differs.append(name)
            continue
        _replace_block(PROFILES / f"{name}.yaml",
                       _block(factors, _calibrated_source(name, result, prior, prior_sources)))
    h100 = fitted["dgx-h100"]
    followers = {
        "dgx-h200": (dict(h100), (
            "NOT CALIBRATED ON H200 RUNS (none in benchmarks/published_runs.yaml): the fractions "
            "fitted for dgx-h100 (see its efficiency.source, benchmarks/recalibrate.py), carried over "
            "because the H200 has the same GH100 die, Tensor Cores, NVLink 4 and NDR NICs (same "
            "measured MAMF, 794.5 of 989 TFLOP/s, stas00/ml-engineering); its larger and faster HBM "
            "enters through gpu.hbm_capacity and gpu.hbm_bandwidth, not through these fractions. "
            "Refine with `plan3d calibrate` on measured H200 runs.")),
        "dgx-b200": ({**h100, "matmul": round(h100["matmul"] * B200_MATMUL_RATIO, 3),
                      "matmul_half_flops": B200_HALF_FLOPS}, (
            "NOT CALIBRATED ON B200 RUNS (none in benchmarks/published_runs.yaml). matmul: the "
            f"dgx-h100 calibrated fraction {h100['matmul']:.3f} scaled by the ratio of measured "
            "maximum achievable bf16 matmul efficiencies, B200 1745.0/2250 = 77.6% vs H100 "
            "792.1/989 = 80.1% (stas00/ml-engineering MAMF table). matmul_half_flops: ~1.6 us of "
            "work at the B200 peak. attention, hbm, nvlink, network, step_overhead: the dgx-h100 "
            "calibrated values (no published B200 measurement read; benchmarks/recalibrate.py). "
            "Refine with `plan3d calibrate` on measured B200 runs.")),
        "hgx-h800": (dict(h100), (
            "NOT CALIBRATED ON H800 RUNS (none in benchmarks/published_runs.yaml): all seven "
            "fractions are the ones fitted for dgx-h100 (see its efficiency.source, "
            "benchmarks/recalibrate.py), carried over unchanged -- matmul, matmul_half_flops, "
            "attention and hbm because the H800 has the H100's GH100 die, Tensor Cores and HBM3 "
            "(Zhao et al. 2025, arXiv:2505.09343, Sec. 4.1); nvlink and network because its NVLink 4 "
            "switches and NDR ConnectX-7 NICs are the H100's parts; step_overhead because it is the "
            "same software stack's per-step time. The cut NVLink enters through "
            "intra_node.bandwidth_per_gpu (200 GB/s), not through these fractions. DeepSeek's own "
            "figures would put nvlink near 0.80 (about 160 of 200 GB/s achieved, Sec. 4.3) and "
            "network near 0.80 (all-to-all above 40 of 50 GB/s, Sec. 4.2); they are not fitted here. "
            "FP8 factors are calibrated later. Refine with `plan3d calibrate` on measured H800 "
            "runs.")),
        "gb200-nvl72": ({**h100, "matmul": round(h100["matmul"] * GB200_MATMUL_RATIO, 3),
                         "matmul_half_flops": GB200_HALF_FLOPS}, (
            "NOT CALIBRATED ON GB200 RUNS (none in benchmarks/published_runs.yaml). matmul: the "
            f"dgx-h100 calibrated fraction {h100['matmul']:.3f} scaled by the ratio of measured "
            "maximum achievable bf16 matmul efficiencies, GB200 1822.0/2500 = 72.9% "
            "(stas00/ml-engineering @ 744d01e MAMF table) vs H100 792.1/989 = 80.1% (the ratio "
            "dgx-b200 uses). matmul_half_flops: ~1.6 us of work at the GB200 peak (2500 TFLOP/s). "
            "attention, hbm, nvlink, network, step_overhead: the dgx-h100 calibrated values, as "
            "dgx-b200 takes them (no published GB200 measurement read). "
            "fp8_hardware.md 5.4's FP8 starting point (matmul_fp8 about "
            "0.99 of the bf16 fraction on GB200) is for the FP8 calibration, not used here. Refine "
            "with `plan3d calibrate` on measured GB200 runs.")),
    }
    for name, (factors, source) in followers.items():
        if args.check:
            if _differs(name, factors):
                differs.append(name)
            continue
        _replace_block(PROFILES / f"{name}.yaml", _block(factors, source))
        print(f"{name}: follows dgx-h100")
    if args.check and differs:
        print(f"not what a fresh fit gives: {', '.join(differs)} (run benchmarks/recalibrate.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
