"""Pipeline schedules: in-flight micro-batches and the bubble (formulas.md 3.5 and 6).

1F1B (vpp = 1) and interleaved 1F1B (vpp > 1, micro-batches in groups of G: Megatron-Core's
default G = pp, and when pp does not divide the m micro-batches the least G that works,
microbatch_group) in closed form. The other schedules (GPipe, looped BFS, interleaved zero
bubble, ZB-V, DualPipeV, DualPipe) take their peaks from their op orders (scheduled_inflight,
cost.schedule_sim) and their step from the simulator (cost.schedules); which rank holds the
embedding and the head, and DualPipe's two parameter copies, are theirs too (holds_embedding,
holds_head, param_copies). Arrays have shape (N,).
"""

from __future__ import annotations

import numpy as np

from ..framework_spec import PIPELINE_SCHEDULES, V_SHAPED_SCHEDULES
from ..layout.degrees import EVERY_CHUNK, cached_per_candidates
from .schedule_sim import closed_peak_chunks, microbatch_group, peak_chunks  # noqa: F401


@cached_per_candidates(0)
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
    if odd.any():   # one (m, pp) key per pair: a 1-D unique (pp < 2**20)
        keys, inverse = np.unique(m[odd] * (1 << 20) + pp[odd], return_inverse=True)
        values = np.array([microbatch_group(int(k >> 20), int(k & ((1 << 20) - 1))) for k in keys],
                          dtype=np.float64)
        group[odd] = values[inverse.reshape(-1)]
    return group


@cached_per_candidates(0)
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
    """How many of a rank's first ``n`` forward passes run model chunk ``chunk`` (-1: none;
    layout.degrees.EVERY_CHUNK: any, so all n) under Megatron-Core's interleaved order, where
    forward k runs chunk (k // G) % vpp (micro-batch groups of G, ``get_model_chunk_id``): G per
    whole block of G forwards on that chunk, plus the rest of an unfinished block. Float
    array."""
    n = np.asarray(n, dtype=np.float64)
    group = np.asarray(group, dtype=np.float64)
    vpp = np.asarray(vpp, dtype=np.float64)
    chunk = np.asarray(chunk, dtype=np.float64)
    blocks, rest = np.floor(n / group), np.mod(n, group)
    whole = np.maximum(0.0, np.ceil((blocks - chunk) / vpp))
    partial = np.where(np.mod(blocks, vpp) == chunk, rest, 0.0)
    return np.where(chunk == EVERY_CHUNK, n, np.where(chunk < 0, 0.0, group * whole + partial))


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


# ---------------------------------------------------------------- the simulated schedules

# Schedule codes (layout.axes, framework_spec.PIPELINE_SCHEDULES): 0 1F1B and 1 interleaved 1F1B
# keep the closed forms above; from SIMULATED on, the op order of planner.schedule decides the
# step (cost.schedules) and the activation peaks (scheduled_inflight).
SIMULATED = 2
_NAMES = PIPELINE_SCHEDULES
_V_SHAPE = tuple(_NAMES.index(name) for name in V_SHAPED_SCHEDULES)
_DUALPIPE = _NAMES.index("dualpipe")


_CODE = {name: code for code, name in enumerate(PIPELINE_SCHEDULES)}


def schedule_chunks_ok(code, vpp, pp) -> np.ndarray:
    """The pipeline schedule against the model chunks per rank (vpp) and pp: 1F1B, GPipe and
    DualPipe run one chunk per rank; interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2), looped
    BFS and interleaved zero bubble vpp > 1; the V shapes ZB-V and DualPipeV exactly two
    (PyTorch raises otherwise; reference/pipeline_schedules.md §8, §11); every schedule but
    1F1B and interleaved 1F1B (the frameworks' own interleaving rules) needs pp > 1 (with
    pp = 1 there is no pipeline to schedule). planner.schedule.orders' constraints, vectorized.
    Bool array."""
    code, vpp, pp = np.asarray(code), np.asarray(vpp), np.asarray(pp)
    one = np.isin(code, [_CODE["1f1b"], _CODE["gpipe"], _CODE["dualpipe"]])
    two = np.isin(code, [_CODE["zbv"], _CODE["dualpipev"]])
    chunks = np.where(one, vpp == 1, np.where(two, vpp == 2, vpp > 1))
    return chunks & ((pp > 1) | (code <= _CODE["interleaved-1f1b"]))


def schedule_microbatches_ok(code, pp, m) -> np.ndarray:
    """The micro-batches per step ``m`` each schedule's generator takes (planner.schedule.orders,
    reference §9-§11): DualPipe p and m even and m >= 2p (deepseek-ai/DualPipe@3da1bbe
    dualpipe.py L332-333); DualPipeV m >= 2p (dualpipev.py L318); interleaved zero bubble
    m >= p and m a multiple of max(1, m // p) (PyTorch ScheduleInterleavedZeroBubble's rounds,
    pytorch@00722e648b74 schedules.py; its step time is in closed form only for m >= p).
    1F1B, interleaved 1F1B, GPipe, looped BFS and ZB-V: their frameworks' rules. Bool array."""
    code, pp, m = np.asarray(code), np.asarray(pp), np.asarray(m)
    dual = (pp % 2 == 0) & (m % 2 == 0) & (m >= 2 * pp)
    rounds = np.maximum(1, m // np.maximum(pp, 1))
    return np.where(code == _CODE["dualpipe"], dual,
                    np.where(code == _CODE["dualpipev"], m >= 2 * pp,
                             np.where(code == _CODE["interleaved-zero-bubble"],
                                      (m >= pp) & (m % rounds == 0), True)))


def schedule_runs(c, m) -> np.ndarray:
    """Where the candidates' schedule generator takes their layout (schedule_chunks_ok and
    schedule_microbatches_ok with ``m`` micro-batches). Bool array."""
    code = c.pipeline_schedule
    return schedule_chunks_ok(code, c.vpp, c.pp) & schedule_microbatches_ok(code, c.pp, np.rint(m))


def simulated(c) -> np.ndarray:
    """Where a candidate's pipeline schedule is one of the simulated ones (code >= SIMULATED)
    and the pipeline has more than one rank. Bool array."""
    return (np.asarray(c.pipeline_schedule) >= SIMULATED) & (np.asarray(c.pp) > 1)


def v_shaped(c) -> np.ndarray:
    """Where the schedule places stages in a V (ZB-V, DualPipeV: rank r holds stages r and
    2p-1-r, reference §8, §11) on pp > 1 ranks. Bool array."""
    return np.isin(np.asarray(c.pipeline_schedule), _V_SHAPE) & (np.asarray(c.pp) > 1)


def holds_embedding(c, rank) -> np.ndarray:
    """Whether pipeline rank ``rank`` holds the embedding (stage 0): rank 0, and with DualPipe
    also rank pp-1, which holds stage 0 of the second direction (deepseek-ai/DualPipe@3da1bbe
    dualpipe.py L345-353). Bool array."""
    rank, pp = np.asarray(rank), np.asarray(c.pp)
    dual = np.asarray(c.pipeline_schedule) == _DUALPIPE
    if not np.any(dual):  # the common case keeps the small shape of rank
        return rank == 0
    return (rank == 0) | (dual & (rank == pp - 1))


def holds_head(c, rank) -> np.ndarray:
    """Whether pipeline rank ``rank`` holds the last stage (final norm, output layer, loss, MTP):
    rank pp-1; in the V shapes (ZB-V, DualPipeV: rank r holds stages r and 2p-1-r) rank 0;
    with DualPipe ranks 0 and pp-1 (stage p-1 of one direction each) (reference §8, §10, §11;
    torchtitan pipeline_parallel.py L560-567). Bool array."""
    code = np.asarray(c.pipeline_schedule)
    if not np.any(code == _DUALPIPE):  # one head: the rank that runs the loss
        return runs_loss(c, rank)
    return runs_loss(c, rank) | ((code == _DUALPIPE) & (np.asarray(rank) == 0))


def runs_loss(c, rank) -> np.ndarray:
    """Whether pipeline rank ``rank``'s every micro-batch runs the output layer and the loss
    (their compute and TP collectives, cost.volumes.edge_collectives): rank pp-1, rank 0 in the
    V shapes (holds_head). DualPipe's two head ranks, each the loss of one direction's half of
    the micro-batches, are counted as one on rank pp-1. Bool array."""
    rank, pp = np.asarray(rank), np.asarray(c.pp)
    v = v_shaped(c)
    if not np.any(v):  # the common case keeps the small shape of rank and pp
        return rank == pp - 1
    return np.where(v, rank == 0, rank == pp - 1)


def param_copies(c) -> np.ndarray:
    """Copies of its stage's parameters a rank holds: 2 with DualPipe (stages r and p-1-r of the
    two directions, DeepSeek-V3 §3.2.1; their gradients summed across the mirrored ranks,
    DualPipe examples/example_dualpipe.py L167-174), else 1. Float array (1.0 where no
    candidate runs DualPipe)."""
    dual = (np.asarray(c.pipeline_schedule) == _DUALPIPE) & (np.asarray(c.pp) > 1)
    return np.where(dual, 2.0, 1.0) if np.any(dual) else 1.0


def _groups(keys: list[np.ndarray]):
    """(values, positions) per distinct row of the int ``keys`` (each (n,), non-negative):
    one int64 key per row (mixed radix), so np.unique sorts a flat array."""
    cols = [np.asarray(k, dtype=np.int64).reshape(-1) for k in keys]
    key = np.zeros(cols[0].shape, dtype=np.int64)
    for col in cols:
        key = key * (int(col.max(initial=0)) + 1) + col
    values, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    for j, at in enumerate(first.tolist()):
        yield [int(col[at]) for col in cols], np.flatnonzero(inverse == j)


def scheduled_peak_chunks(c, m, rank, gamma) -> np.ndarray:
    """The activation peak of pipeline rank ``rank`` in chunks for candidates whose schedule is
    simulated, in-flight plus ``gamma`` (the deferred-W share, memory.deferred_w_fraction) x
    pending W, as the schedule's op order gives it: schedule_sim.closed_peak_chunks on the
    broadcast arrays, and where it has none (ZB-V with m < 2p - 1) schedule_sim.peak_chunks per
    distinct (schedule, pp, m, vpp, rank); infinite where the generator refuses the layout.
    Broadcast float array (meaningful where simulated(c))."""
    code, pp, vpp, m = c.pipeline_schedule, c.pp, c.vpp, np.rint(m)
    runs = schedule_chunks_ok(code, vpp, pp) & schedule_microbatches_ok(code, pp, m)
    out = np.where(runs, closed_peak_chunks(code, pp, m, vpp, rank, gamma), np.inf)
    rest = np.isnan(out) & simulated(c)
    if np.any(rest):
        shape = out.shape
        index = np.nonzero(np.broadcast_to(rest, shape))
        pick = lambda a: np.broadcast_to(np.asarray(a), shape)[index]  # noqa: E731
        keys = [pick(x) for x in (code, pp, m, vpp, rank)]
        gam = pick(gamma).astype(np.float64)
        values = np.zeros(gam.shape)
        for (k, p, m_, v, r), sel in _groups(keys):
            values[sel] = peak_chunks(_NAMES[k], p, m_, v, r, gam[sel])
        out[index] = values
    return out


def edge_microbatches(c, m, first, last) -> tuple[np.ndarray, np.ndarray]:
    """(micro-batches whose token ids rank 0 holds, the loss's buffers held) where all forwards
    run before any backward (GPipe, looped BFS: all m micro-batches in flight on every rank,
    reference §1, §5): ``first`` -> m and ``last`` (one micro-batch's loss buffers, bytes) x m;
    unchanged elsewhere (1F1B-like orders run the loss's backward right after its forward).
    Float arrays."""
    code = np.asarray(c.pipeline_schedule)
    all_forwards = np.isin(code, [_CODE["gpipe"], _CODE["looped-bfs"]]) & (np.asarray(c.pp) > 1)
    m = np.asarray(m, dtype=np.float64)
    return np.where(all_forwards, m, first), np.where(all_forwards, m * last, last)


def scheduled_inflight(c, num_layers: int, m, rank, gamma, held) -> np.ndarray:
    """``held`` (inflight_layers: layers' worth of activations at the peak of rank ``rank``) with
    the simulated schedules' peaks in their place: peak chunks (scheduled_peak_chunks) x the
    rank's layers per chunk (rank_layers / vpp). Unchanged where no candidate's schedule is
    simulated. Float array."""
    sim = simulated(c)
    if not np.any(sim):
        return held
    chunks = scheduled_peak_chunks(c, m, rank, gamma)
    per_chunk = c.rank_layers(num_layers, rank) / np.asarray(c.vpp)
    with np.errstate(invalid="ignore"):  # inf x 0: a refused layout on a rank with no layer
        peak = np.where(np.isinf(chunks), np.inf, chunks * per_chunk)
    return np.where(sim, peak, held)
