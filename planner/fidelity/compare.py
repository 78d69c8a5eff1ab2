"""Measured vs predicted for published runs: per-run comparisons and per-source error summaries.

The predicted step time is turned into the source's own figure (TFLOP/s per GPU, MFU, HFU,
tokens/s) with the source's own FLOP formula and peak (conventions.py), so both sides of every
comparison count FLOPs the same way. Errors are relative: (predicted - measured) / measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.model_counts import total_params
from ..cost.model_flops import model_flops_per_step
from ..cost.step import estimate_layout
from ..specs import HardwareProfile
from . import conventions
from .runs import RunCase
from ..cost.step import evaluate
from ..layout import Candidates

# Order in which a row's figures are used as its headline comparison (least ambiguous first).
PRIMARY_ORDER = ("iteration_s", "flops_per_gpu", "mfu", "tokens_per_s")


@dataclass
class Comparison:
    """One run: measured and predicted figures (SI units), their relative errors, the headline metric."""

    case: RunCase
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    error: dict[str, float] = field(default_factory=dict)
    primary: str | None = None
    fits: bool = True
    step_s: float = 0.0

    @property
    def primary_error(self) -> float | None:
        return self.error.get(self.primary) if self.primary else None

    @property
    def time_ratio(self) -> float:
        """T_pred / T_meas implied by the headline figure (iteration time directly; TFLOP/s,
        MFU, HFU and tokens/s inversely: each is proportional to 1/T)."""
        assert self.primary is not None
        ratio = self.predicted[self.primary] / self.measured[self.primary]
        return ratio if self.primary == "iteration_s" else 1.0 / ratio

    @property
    def step_error(self) -> float:
        """(T_pred - T_meas) / T_meas: the step-time error the headline figure implies."""
        return self.time_ratio - 1.0

    @property
    def tokens_error(self) -> float:
        """The tokens/s error the headline figure implies: T_meas / T_pred - 1."""
        return 1.0 / self.time_ratio - 1.0


def source_flops(case: RunCase) -> dict[str, float]:
    """FLOPs of one step as the run's source counts them: keys 'flops' (TFLOP/s numerator), 'mfu', 'hfu'."""
    m, t, lay = case.model, case.training, case.layout
    assert m is not None and t is not None and lay is not None
    B, s, L, h, V = t.global_batch_size, t.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    if case.convention == "narayanan":
        f = conventions.narayanan_flops(B, s, L, h, V)
        return {"flops": f, "hfu": f}
    if case.convention == "korthikanti":
        f_model = conventions.korthikanti_model_flops(B, s, L, h, V)
        f_hw = {"selective": conventions.korthikanti_hardware_flops(B, s, L, h, V),
                "full": conventions.narayanan_flops(B, s, L, h, V)}.get(lay.recompute, f_model)
        return {"flops": f_model, "mfu": f_model, "hfu": f_hw}
    if case.convention == "megatron":
        # Megatron-LM's num_floating_point_operations of 2024 (full, non-causal attention: the
        # causal count arrived in 2025-03), which plan3d's model FLOPs follow (formulas.md 4.1)
        f = float(np.asarray(model_flops_per_step(m, s, B, np.asarray([lay.tp]), causal=False))[0])
        return {"flops": f, "mfu": f}
    if case.convention == "mosaic":
        n = float(total_params(m))
        f_model = conventions.mosaic_flops(B, s, L, h, n)
        f_hw = conventions.mosaic_flops(B, s, L, h, n, recompute=lay.recompute == "full")
        return {"flops": f_model, "mfu": f_model, "hfu": f_hw}
    return {}


def compare(case: RunCase, hardware: HardwareProfile | None = None,
            time_only: bool = False) -> Comparison:
    """Predict one (non-skipped) run and compare with what was measured; ``hardware`` overrides
    the profile. ``time_only``: the step time alone (cost.evaluate's summary pass, what fits
    need), no memory: ``fits`` stays True and peak memory is not compared."""
    hw = hardware or case.hardware
    assert hw is not None and case.model is not None and case.training is not None and case.layout
    if time_only:
        est = evaluate(case.model, hw, case.training, Candidates.from_layouts([case.layout]), summary=True)
        fits = True
    else:
        est = estimate_layout(case.model, hw, case.training, case.layout)
        fits = bool(est.fits[0])
    step = float(est.time["step"][0])
    out = Comparison(case=case, fits=fits, step_s=step)
    gpus = case.layout.gpus
    peak = case.peak_flops
    flops = source_flops(case)
    meas = case.measured

    def add(key: str, measured: float, predicted: float) -> None:
        out.measured[key], out.predicted[key] = measured, predicted
        out.error[key] = (predicted - measured) / measured

    if "iteration_s" in meas:
        add("iteration_s", meas["iteration_s"], step)
    if "flops_per_gpu" in meas and "flops" in flops:
        add("flops_per_gpu", meas["flops_per_gpu"], flops["flops"] / (step * gpus))
    for key in ("mfu", "hfu"):
        if key in meas and key in flops:
            add(key, meas[key], flops[key] / (step * gpus * peak))
    if "tokens_per_s" in meas:
        add("tokens_per_s", meas["tokens_per_s"], case.training.global_batch_size *
            case.training.seq_length / step)
    if "peak_memory" in meas and not time_only:
        # Sources report the allocator's peak (PyTorch max memory allocated): states, activations
        # and buffers, but not the reserve (CUDA context, NCCL buffers, what the allocator holds
        # above allocated), so the reserve is left out of the predicted side.
        add("peak_memory", meas["peak_memory"], float(est.memory["total"][0] - est.memory["reserve"][0]))
    out.primary = next((k for k in PRIMARY_ORDER if k in out.error), None)
    return out


def compare_all(cases: list[RunCase]) -> list[Comparison]:
    """Comparisons for every non-skipped case, in file order. A case with no figure that can be
    compared (none measured, or only FLOP-based ones with no known FLOP convention) gets a
    ``skipped`` reason instead of a comparison."""
    out = []
    for c in cases:
        if c.skipped is not None:
            continue
        comp = compare(c)
        if comp.error:
            out.append(comp)
        elif not c.measured:
            c.skipped = "no measured figure to compare"
        else:
            c.skipped = (f"measured {', '.join(sorted(c.measured))} but no FLOP convention is known "
                         "for its source (tag the notes [flops=narayanan|korthikanti|mosaic])")
    return out


def _stats(values: list[float]) -> tuple[float, float]:
    """(mean, max) of absolute values; NaN for none."""
    vals = [abs(v) for v in values]
    return (sum(vals) / len(vals), max(vals)) if vals else (float("nan"), float("nan"))


def is_false_oom(c: "Comparison") -> bool:
    """A measured run predicted not to fit after --resolve search (``case.resolution`` set):
    with its layout fully stated, resolved by the search, or costed in place, the run ran, so
    plan3d's memory model is wrong for it. Under --resolve default a no-fit may come from the
    defaults and is not counted."""
    return not c.fits and bool(c.case.resolution)


def summarize(comparisons: list[Comparison],
              loso: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Per group (source): n; mean and max |error| of the headline metric, of the step time and
    tokens/s it implies, of the step time predicted without the source (``loso``: run id ->
    error, planner.fidelity.loso) and of peak memory where measured; how many runs are
    predicted not to fit and, under --resolve search, how many of those are false OOMs (every run
    in a runs file ran: one that no layout consistent with it fits, stated or resolved, is a
    false OOM; is_false_oom)."""
    groups: dict[str, list[Comparison]] = {}
    for c in comparisons:
        groups.setdefault(c.case.group, []).append(c)
    summary = {}
    for name, items in groups.items():
        timed = [c for c in items if c.primary is not None]
        mean, worst = _stats([c.primary_error for c in timed])
        row = {"runs": float(len(items)), "metric": items[0].primary or "",
               "mean_abs_error": mean, "max_abs_error": worst,
               "predicted_not_to_fit": float(sum(not c.fits for c in items)),
               "false_oom": float(sum(is_false_oom(c) for c in items))}
        row["step_mean_abs_error"], row["step_max_abs_error"] = _stats([c.step_error for c in timed])
        row["tokens_mean_abs_error"], row["tokens_max_abs_error"] = _stats([c.tokens_error for c in timed])
        if loso is not None:
            held = [loso[c.case.id] for c in timed if c.case.id in loso]
            row["loso_mean_abs_error"], row["loso_max_abs_error"] = _stats(held)
        mem = [c.error["peak_memory"] for c in items if "peak_memory" in c.error]
        if mem:
            row["memory_mean_abs_error"], row["memory_max_abs_error"] = _stats(mem)
        summary[name] = row
    return summary
