"""Pipeline schedules: in-flight micro-batches and the bubble (formulas.md 3.5 and 6).

1F1B (vpp = 1) and interleaved 1F1B (vpp > 1, micro-batches in groups of G: Megatron-Core's
default G = pp, and when pp does not divide the m micro-batches the least G that works,
microbatch_group). Arrays have shape (N,).
"""

from __future__ import annotations

import numpy as np

from ..layout.degrees import cached_per_candidates


def microbatch_group(m: int, pp: int) -> int:
    """Megatron-Core's micro-batch group G of the interleaved schedule for m micro-batches on pp
    stages: pp when pp divides m, else the least G with pp <= G <= m and m mod G either 0 or
    >= pp (megatron/core/pipeline_parallel/schedules.py L1160-1180). m = 10, pp = 4: 5;
    m = 9, pp = 4: 5 (9 mod 5 = 4). ValueError if m < pp."""
    for group in range(pp, m + 1):
        if m % group == 0 or m % group >= pp:
            return group
    raise ValueError(f"{m} micro-batches cannot be interleaved on {pp} stages")


def microbatch_groups(c, m) -> np.ndarray:
    """microbatch_group per interleaved candidate (pp where pp divides m, where m < pp, which the
    interleaving rule refuses, and where vpp = 1, which has no groups), computed once per
    distinct (m, pp) pair. Float array."""
    pp = np.asarray(c.pp, dtype=np.int64)
    shape = np.broadcast_shapes(np.shape(m), pp.shape, np.shape(c.vpp))
    m = np.broadcast_to(np.asarray(m, dtype=np.int64), shape)
    pp = np.broadcast_to(pp, shape)
    group = pp.astype(np.float64)
    odd = (np.asarray(c.vpp) > 1) & (m % pp != 0) & (m >= pp)
    if odd.any():
        pairs, inverse = np.unique(np.stack([m[odd], pp[odd]], axis=1), axis=0, return_inverse=True)
        values = np.array([microbatch_group(int(a), int(b)) for a, b in pairs], dtype=np.float64)
        group[odd] = values[inverse.reshape(-1)]
    return group


def _forwards_held(c, m, rank) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, interleaved, G): forward chunks rank ``rank`` holds at its activation peak and the
    micro-batch group. 1F1B: min(pp - r, m) micro-batches; interleaved: min(2*(pp-r-1) +
    (vpp-1)*G + 1, m*vpp) chunk forwards (warm-up + 1, Megatron-Core ``get_pp_rank_microbatches``,
    G = microbatch_groups; formulas.md 3.5). Float arrays."""
    pp = np.asarray(c.pp, dtype=np.float64)
    vpp = np.asarray(c.vpp, dtype=np.float64)
    rank = np.asarray(rank, dtype=np.float64)
    interleaved = vpp > 1
    group = microbatch_groups(c, m)
    m = np.asarray(m, dtype=np.float64)
    n = np.where(interleaved, np.minimum(2 * (pp - rank - 1) + (vpp - 1) * group + 1, m * vpp),
                 np.minimum(pp - rank, m))
    return n, interleaved, group


def chunk_forwards(n, chunk, group, vpp) -> np.ndarray:
    """How many of a rank's first ``n`` forward passes run model chunk ``chunk`` (-1: none) under
    Megatron-Core's interleaved order, where forward k runs chunk (k // G) % vpp (micro-batch
    groups of G, ``get_model_chunk_id``): G per whole block of G forwards on that chunk, plus
    the rest of an unfinished block. Float array."""
    n = np.asarray(n, dtype=np.float64)
    group = np.asarray(group, dtype=np.float64)
    vpp = np.asarray(vpp, dtype=np.float64)
    chunk = np.asarray(chunk, dtype=np.float64)
    blocks, rest = np.floor(n / group), np.mod(n, group)
    whole = np.maximum(0.0, np.ceil((blocks - chunk) / vpp))
    partial = np.where(np.mod(blocks, vpp) == chunk, rest, 0.0)
    return np.where(chunk < 0, 0.0, group * whole + partial)


@cached_per_candidates(0)
def inflight_layers(c, num_layers: int, m, rank) -> np.ndarray:
    """Layers' worth of activations held at the peak on pipeline rank ``rank`` (0-based).

    1F1B: min(pp - r, m) micro-batches of the rank's layers. Interleaved: the first n chunk
    forwards (_forwards_held) of the rank's chunks (LayoutDegrees.rank_chunk_layers): n * chunk
    layers, less one layer per forward of the chunk that is one short (the embedding-and-loss
    split). Rank 0 with m >= pp and even chunks gives Korthikanti's L*(1 + (pp-1)/(pp*vpp)).
    14 layers on pp 4, vpp 2, 3 + 4 + 4 + 3 (chunks [1, 2] on rank 0, [2, 1] on rank 3): rank 3
    holds 4 forwards of chunk 0 and 1 of chunk 1 = 9 layers. Float array."""
    n, interleaved, group = _forwards_held(c, m, rank)
    layers = c.rank_layers(num_layers, rank)
    chunk, short = c.rank_chunk_layers(num_layers, rank)
    held = n * chunk - chunk_forwards(n, short, group, c.vpp)
    return np.where(interleaved, held, n * layers)


def inflight_first_chunk(c, m, rank) -> np.ndarray:
    """Micro-batches whose first model chunk rank ``rank`` holds at its peak (the embedding's
    inputs on rank 0): 1F1B the forwards held, interleaved those of chunk 0. Float array."""
    n, interleaved, group = _forwards_held(c, m, rank)
    return np.where(interleaved, chunk_forwards(n, 0, group, c.vpp), n)


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
