"""Pipeline schedules: in-flight micro-batches and the bubble (formulas.md 3.5 and 6).

1F1B (vpp = 1) and interleaved 1F1B (vpp > 1, Megatron's default micro-batch group size = pp).
Arrays have shape (N,).
"""

from __future__ import annotations

import numpy as np

from ..degrees import cached_per_candidates


def _forwards_held(c, m, rank) -> tuple[np.ndarray, np.ndarray]:
    """(n, interleaved): forward chunks rank ``rank`` holds at its activation peak. 1F1B: min(pp -
    r, m) micro-batches; interleaved: min(2*(pp-r-1) + (vpp-1)*pp + 1, m*vpp) chunk forwards
    (warm-up + 1, Megatron-Core ``get_pp_rank_microbatches``). Float arrays."""
    pp = np.asarray(c.pp, dtype=np.float64)
    vpp = np.asarray(c.vpp, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    rank = np.asarray(rank, dtype=np.float64)
    interleaved = vpp > 1
    n = np.where(interleaved, np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp),
                 np.minimum(pp - rank, m))
    return n, interleaved


def chunk_forwards(n, chunk, pp, vpp) -> np.ndarray:
    """How many of a rank's first ``n`` forward passes run model chunk ``chunk`` (-1: none) under
    Megatron-Core's interleaved order, where forward k runs chunk (k // pp) % vpp (micro-batch
    groups of pp, ``get_model_chunk_id``): pp per whole block of pp forwards on that chunk, plus
    the rest of an unfinished block. Float array."""
    n = np.asarray(n, dtype=np.float64)
    pp = np.asarray(pp, dtype=np.float64)
    vpp = np.asarray(vpp, dtype=np.float64)
    chunk = np.asarray(chunk, dtype=np.float64)
    blocks, rest = np.floor(n / pp), np.mod(n, pp)
    whole = np.maximum(0.0, np.ceil((blocks - chunk) / vpp))
    partial = np.where(np.mod(blocks, vpp) == chunk, rest, 0.0)
    return np.where(chunk < 0, 0.0, pp * whole + partial)


@cached_per_candidates(0)
def inflight_layers(c, num_layers: int, m, rank) -> np.ndarray:
    """Layers' worth of activations held at the peak on pipeline rank ``rank`` (0-based).

    1F1B: min(pp - r, m) micro-batches of the rank's layers. Interleaved: the first n chunk
    forwards (_forwards_held) of the rank's chunks (LayoutDegrees.rank_chunk_layers): n * chunk
    layers, less one layer per forward of the chunk that is one short (the embedding-and-loss
    split). Rank 0 with m >= pp and even chunks gives Korthikanti's L*(1 + (pp-1)/(pp*vpp)).
    14 layers on pp 4, vpp 2, 3 + 4 + 4 + 3 (chunks [1, 2] on rank 0, [2, 1] on rank 3): rank 3
    holds 4 forwards of chunk 0 and 1 of chunk 1 = 9 layers. Float array."""
    n, interleaved = _forwards_held(c, m, rank)
    layers = c.rank_layers(num_layers, rank)
    chunk, short = c.rank_chunk_layers(num_layers, rank)
    held = n * chunk - chunk_forwards(n, short, c.pp, c.vpp)
    return np.where(interleaved, held, n * layers)


def inflight_first_chunk(c, m, rank) -> np.ndarray:
    """Micro-batches whose first model chunk rank ``rank`` holds at its peak (the embedding's
    inputs on rank 0): 1F1B the forwards held, interleaved those of chunk 0. Float array."""
    n, interleaved = _forwards_held(c, m, rank)
    return np.where(interleaved, chunk_forwards(n, 0, c.pp, c.vpp), n)


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
