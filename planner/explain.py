"""Explanations as data (rendered by planner.report_scale): breakdowns and term-by-term gaps.

A step time is the sum of TIME_TERMS (planner.cost.step), so the gap between two layouts is
exactly the sum of their per-term differences; the same holds for memory and MEMORY_TERMS.
"""

from __future__ import annotations

from .cost import Estimate
from .cost.step import MEMORY_TERMS, TIME_TERMS


def time_breakdown(est: Estimate, i: int = 0) -> list[tuple[str, float]]:
    """[(term, seconds)] of candidate i's step, in TIME_TERMS order; they sum to the step."""
    return [(t, float(est.time[t][i])) for t in TIME_TERMS]


def memory_breakdown(est: Estimate, i: int = 0) -> list[tuple[str, float]]:
    """[(term, bytes)] of candidate i's peak-stage memory, in MEMORY_TERMS order; sum = total."""
    return [(t, float(est.memory[t][i])) for t in MEMORY_TERMS]


def term_deltas(slow: Estimate, i: int, fast: Estimate, j: int) -> list[tuple[str, float]]:
    """[(term, seconds slow - fast)] sorted largest first; they sum to the step-time gap."""
    deltas = [(t, float(slow.time[t][i] - fast.time[t][j])) for t in TIME_TERMS]
    return sorted(deltas, key=lambda d: d[1], reverse=True)
