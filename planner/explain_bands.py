"""Explanations of plan3d's error bands and its top tie group, as data (formatted by
planner.render): a search's BandSummary, each ranked layout's band and tie Preferences, the
TieSummary under the search table, and the ``band`` of an estimate's JSON (search.bands,
search.ties)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import Layout
from .search.bands import BY_TERM, Band, regime, shipped, unchecked, widening
from .search.ties import UNCONVENTIONAL


@dataclass(frozen=True)
class BandSummary:
    """The error bands of a search's job (search.bands): the step-time and peak-memory Bands of
    its regime, the tie band (a fraction of the step: e^q - 1) and how many measured pairs it
    comes from, the --min-free share, and the file they are read from."""

    step: Band
    memory: Band
    tie: float
    pairs: int
    min_free: float
    path: str


@dataclass(frozen=True)
class Preferences:
    """What the tie preferences (search.ties) read of one layout: the share and bytes of HBM
    it leaves free, whether that is at least --min-free, the unchecked terms and the
    unconventional marks it has (labels), its pipeline stages."""

    free: float
    free_bytes: float
    roomy: bool
    unchecked: tuple[str, ...]
    marks: tuple[str, ...]
    pp: int


@dataclass(frozen=True)
class TieSummary:
    """The top tie group of a search (search.ties): its table ``rows`` and ``layouts``; the
    row (1-based) of the layout with the best score and that layout (None when it is the
    pick or not kept) and how much better its score is (a fraction); the preferences that
    decided (search.ties.PREFERENCES); the pick's and the fastest's Preferences; ``strict``:
    a strict ranking (no tie groups); ``fastest_in_group``: the group formed around the
    fastest (else around the best layout leaving the --min-free share); ``any_roomy``: some
    kept layout leaves the --min-free share; ``capped``: the group fills the layouts the
    search keeps while more fit (it may hold more)."""

    rows: int
    layouts: int
    fastest_row: int | None
    fastest_layout: Layout | None
    better_by: float
    deciding: tuple[str, ...]
    pick: Preferences
    fastest: Preferences | None
    strict: bool
    fastest_in_group: bool = True
    any_roomy: bool = True
    capped: bool = False


def band_summary(result, model, hw, training) -> BandSummary:
    """The BandSummary of a search's job."""
    b = result.bands
    query = regime(model, hw, training)
    return BandSummary(b.step(query), b.memory(query), float(np.expm1(result.tie_band)), len(b.pairs),
                       result.min_free, b.path)


def row_band(result, band: Band, i: int) -> tuple[float, float]:
    """(below, above): how far under and over ranked layout i's predicted step its measured
    step may be, fractions: the regime's band widened by the layout's unchecked terms."""
    f = result.features
    low, high = band.bounds(1.0, 0.0) if f is None else band.bounds(1.0, float(f.below[i]), float(f.above[i]))
    return float(1.0 - low), float(high - 1.0)


def preferences_of(result, i: int) -> Preferences:
    """The Preferences of ranked layout i (Features of search.ties)."""
    f = result.features
    est = result.ranked
    free_bytes = float(est.memory["capacity"][i] - est.memory["total"][i])
    unchecked = tuple(BY_TERM[k].label for k, v in f.unchecked.items() if v[i])
    marks = tuple(UNCONVENTIONAL[k] for k, v in f.marks.items() if v[i])
    return Preferences(float(f.free[i]), free_bytes, bool(f.roomy[i]), unchecked, marks, int(f.pp[i]))


def tie_summary(result, groups: list) -> TieSummary | None:
    """The TieSummary of a search result whose table shows ``groups`` (explain.tie_groups);
    None where the search kept no preference features."""
    if result.features is None:
        return None
    est = result.ranked
    n = result.tie_group
    rows = sum(1 for g in groups if g.first < n)
    j = result.fastest
    fast = j > 0
    better = 0.0
    if fast:
        tps = est.throughput["tokens_per_s"]
        better = float(tps[j] / tps[0] - 1.0)
    row = next((k for k, g in enumerate(groups, start=1) if j in g.members), None) if fast else None
    return TieSummary(rows, n, row, est.candidates.layout(j) if fast else None, better,
                      tuple(result.deciding), preferences_of(result, 0),
                      preferences_of(result, j) if fast else None, bool(result.strict),
                      result.reference == j or (j < 0 and result.reference == 0),
                      bool(np.any(result.features.roomy)),
                      n >= len(est.candidates) - 1 and result.fitting > len(est.candidates))


def estimate_band(model, hw, training, est, i: int = 0) -> dict:
    """``band`` of an estimate's or a search entry's JSON for layout i of ``est`` (search.bands):
    the measured step, tokens/s and peak memory are expected within ``step_s``,
    ``tokens_per_s`` and ``memory_bytes`` ([low, high]; the memory band applies to the
    allocated memory, the reserve added as predicted) for the ``level`` share of measured runs;
    ``below`` / ``above`` (fractions of the predicted step) include the ``widening`` (below,
    above) of the ``unchecked`` terms; ``regime``, ``runs``, ``sources``: what the band is drawn from;
    ``memory_below`` / ``memory_above`` / ``memory_level`` the same for memory; ``source``: the
    file. Null step and tokens/s where the layout does not fit."""
    bands = shipped()
    query = regime(model, hw, training)
    step_band, mem_band = bands.step(query), bands.memory(query)
    c = est.candidates.take(np.array([i]))
    one = est.take(np.array([i]))
    masks = unchecked(model, hw, training, c, bands)
    ran = "cp_comm" in est.time and bool(np.isfinite(est.time["step"][i]))  # a full estimate
    below, above = widening(one, masks, model, hw, training) if ran else (np.zeros(1), np.zeros(1))
    low, high = step_band.bounds(1.0, float(below[0]), float(above[0]))
    reserve = float(est.memory["reserve"][i])
    allocated = float(est.memory["total"][i]) - reserve
    m_low, m_high = mem_band.bounds(allocated)
    fits = bool(est.memory["total"][i] <= est.memory["capacity"][i])
    step = float(est.time["step"][i]) if fits and ran else None
    tokens = None if step is None else float(est.throughput["tokens_per_s"][i])
    return {"step_s": None if step is None else [step * low, step * high],
            "tokens_per_s": None if tokens is None else [tokens / high, tokens / low if low > 0 else None],
            "memory_bytes": [m_low + reserve, m_high + reserve],
            "below": float(1.0 - low), "above": float(high - 1.0), "level": step_band.level,
            "regime": dict(step_band.basis), "runs": step_band.runs, "sources": step_band.sources,
            "unchecked": [k for k, v in masks.items() if bool(np.asarray(v).ravel()[0])],
            "widening": [float(below[0]), float(above[0])], "memory_below": mem_band.below, "memory_above": mem_band.above,
            "memory_level": mem_band.level, "source": band_source(bands)}


def band_source(bands) -> str:
    """Where bands come from, for JSON and plans: the file's name, date and commit."""
    g = bands.generated
    return f"error_bands.yaml (generated {g.get('date', '?')} at {g.get('commit', '?')} by {g.get('by', '?')})"
