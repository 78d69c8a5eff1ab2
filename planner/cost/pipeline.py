"""Pipeline schedules: in-flight micro-batches and the bubble (formulas.md 3.5 and 6).

1F1B (vpp = 1) and interleaved 1F1B (vpp > 1, Megatron's default micro-batch group size = pp).
Arrays have shape (N,).
"""

from __future__ import annotations

import numpy as np


def inflight_layers(num_layers: int, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
                    rank: np.ndarray) -> np.ndarray:
    """Layers' worth of activations held at the peak on pipeline rank ``rank`` (0-based). (N,)

    1F1B: rank r holds min(pp - r, m) micro-batches of its L/pp layers.
    Interleaved: rank r holds min(2*(pp-r-1) + (vpp-1)*pp + 1, m*vpp) chunks of L/(pp*vpp)
    layers (warm-up + 1, Megatron ``get_pp_rank_microbatches``); rank 0 with m >= pp gives the
    Korthikanti factor L*(1 + (pp-1)/(pp*vpp)).
    """
    pp = np.asarray(pp, dtype=np.float64)
    vpp = np.asarray(vpp, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    rank = np.asarray(rank, dtype=np.float64)
    one_f_one_b = np.minimum(pp - rank, m) * num_layers / pp
    chunks = np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp)
    interleaved = chunks * num_layers / (pp * vpp)
    return np.where(vpp > 1, interleaved, one_f_one_b)


def pipeline_time(stage_first: np.ndarray, stage_middle: np.ndarray, stage_last: np.ndarray,
                  pp: np.ndarray, vpp: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(makespan, bubble) in seconds of one step's forward+backward over the pipeline. (N,), (N,)

    ``stage_*`` are the forward+backward seconds of ONE micro-batch on the first, a middle and
    the last pipeline rank (all its chunks). Makespan (formulas.md 6, generalising Narayanan's
    (m + (p-1)/v) * t to unequal stages):
        T = m * t_max + (sum_r t_r - t_max) / v
    and the bubble is the second term. For equal stages this is (p-1)/(v*m) of the ideal time.
    With pp = 1 the single stage is ``stage_first`` and there is no bubble.
    """
    pp = np.asarray(pp, dtype=np.float64)
    single = pp == 1
    t_max = np.where(single, stage_first, np.maximum(np.maximum(stage_first, stage_last), stage_middle))
    total = np.where(single, stage_first,
                     stage_first + stage_last + np.maximum(pp - 2, 0) * stage_middle)
    bubble = (total - t_max) / vpp
    return m * t_max + bubble, bubble


def even_pipeline_time(stage_middle: np.ndarray, extra_first: np.ndarray, extra_last: np.ndarray,
                       pp: np.ndarray, vpp: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pipeline_time for an even split, where the first and last ranks hold a middle rank's
    work plus their edges: stage_first = stage_middle + extra_first, stage_last = stage_middle +
    extra_last (extras >= 0; with pp = 1 the single stage is stage_middle + extra_first). Then
    t_max = stage_middle + max(extras) and sum_r t_r - t_max = (pp-1)*stage_middle +
    min(extras), so the makespan needs few passes over the full-size ``stage_middle`` while the
    extras keep their smaller broadcast shapes. Same (makespan, bubble) as pipeline_time up to
    rounding. Seconds, broadcast shape."""
    pp = np.asarray(pp, dtype=np.float64)
    single = pp == 1
    high = np.where(single, extra_first, np.maximum(extra_first, extra_last))
    slope = np.where(single, 0.0, (pp - 1) / vpp)
    offset = np.where(single, 0.0, np.minimum(extra_first, extra_last) / vpp)
    bubble = stage_middle * slope + offset
    return m * (stage_middle + high) + bubble, bubble


def bubble_fraction(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Narayanan's bubble fraction for equal stages: (pp - 1) / (vpp * m). (N,)"""
    return (np.asarray(pp, dtype=np.float64) - 1) / (vpp * m)


def uneven_split(num_layers: int, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage layer counts when pp does not divide the layers (Megatron's
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, formulas.md
    1.3). Middle stages hold k = ceil(L/pp) layers each; the rest r = L - (pp-2)*k is halved
    between the edge stages, which also carry the embedding and the output layer: first = r//2,
    last = r - first. Llama-3 405B, 126 layers on pp = 16: k = 8, r = 14, 7 + 14*8 + 7 (the
    Llama 3 paper, §3.3.2, removed one layer from each of the first and last stages).
    (0, 0) where pp divides L (the even split); (-1, -1) where no split leaves each edge stage
    between 1 and k layers. Shape of ``pp``, int64.
    """
    pp = np.asarray(pp, dtype=np.int64)
    k = -(-num_layers // pp)
    rest = num_layers - np.maximum(pp - 2, 0) * k
    first = rest // 2
    last = rest - first
    ok = (pp >= 2) & (first >= 1) & (last <= k)
    even = num_layers % pp == 0
    first = np.where(even, 0, np.where(ok, first, -1))
    last = np.where(even, 0, np.where(ok, last, -1))
    return first.astype(np.int64), last.astype(np.int64)


def stage_layers(num_layers: int, c) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Layers on the first, a middle and the last pipeline rank, (first, middle, last) float
    arrays, where some candidate has an uneven split (``first_stage_layers`` > 0): first/last
    as given, the middle (L - first - last)/(pp - 2); L/pp elsewhere. None if every split is
    even (callers then use L/pp as before)."""
    f = c.first_stage_layers
    if not np.any(f > 0):
        return None
    even = num_layers / c.pp
    uneven = f > 0
    middle = (num_layers - f - c.last_stage_layers) / np.maximum(c.pp - 2, 1)
    return (np.where(uneven, f, even).astype(np.float64),
            np.where(uneven & (c.pp > 2), middle, np.where(uneven, 0.0, even)).astype(np.float64),
            np.where(uneven, c.last_stage_layers, even).astype(np.float64))

