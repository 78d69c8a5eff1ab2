"""Precision pairs: two runs of one source that differ only in precision, and their speed-up.

A source that measures the same job in two precisions (torchtitan's BF16 vs Float8 rows,
Megatron-Bridge's FP8 current scaling vs MXFP8 rows) gives a measured speed-up that cancels
most of what the two runs share (the hardware factors, the layout, the framework's overheads):
predicting it is the direct test of what plan3d's precision model changes (planner/cost/
precision.py). A pair is two compared runs with the same source group, model, hardware,
layout, sequence length and global batch and different ``TrainingSpec.precision``; the
baseline is the higher-precision one (bf16 before fp8 / fp8-blockwise before mxfp8).
"""

from __future__ import annotations

from dataclasses import dataclass

from .compare import Comparison

# Baseline order: the run of the lower rank is the one the other is compared against.
PRECISION_RANK = {"bf16": 0, "fp8": 1, "fp8-blockwise": 1, "mxfp8": 2}


@dataclass(frozen=True)
class PrecisionPair:
    """Baseline and other run of one pair, with measured and predicted speed-ups (T_base / T_other)."""

    base: Comparison
    other: Comparison

    @property
    def measured(self) -> float:
        """T_meas(base) / T_meas(other); T_meas = T_pred / time_ratio (compare.Comparison)."""
        return (self.base.step_s / self.base.time_ratio) / (self.other.step_s / self.other.time_ratio)

    @property
    def predicted(self) -> float:
        """T_pred(base) / T_pred(other)."""
        return self.base.step_s / self.other.step_s

    @property
    def error_points(self) -> float:
        """Predicted minus measured speed-up, in percentage points of the speed-up (x100)."""
        return 100.0 * (self.predicted - self.measured)


def _key(c: Comparison) -> tuple:
    case = c.case
    t = case.training
    # the model by its shape (a run's model carries the run id as its name)
    return (case.group, case.model.model_dump_json(exclude={"name"}), case.hardware.name,
            case.layout.model_dump_json(), t.seq_length, t.global_batch_size)


def precision_pairs(comparisons: list[Comparison]) -> list[PrecisionPair]:
    """Every pair (see module docstring) among ``comparisons`` with a headline figure, in the
    order the baselines appear. Runs of one key in more than two precisions pair each
    non-baseline run with the highest-precision baseline."""
    groups: dict[tuple, list[Comparison]] = {}
    for c in comparisons:
        if c.primary is None or c.case.training is None:
            continue
        groups.setdefault(_key(c), []).append(c)
    out = []
    for members in groups.values():
        ranked = sorted(members, key=lambda c: PRECISION_RANK[c.case.training.precision])
        base = ranked[0]
        for other in ranked[1:]:
            if other.case.training.precision != base.case.training.precision:
                out.append(PrecisionPair(base, other))
    return out
