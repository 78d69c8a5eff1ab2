"""The pipeline-schedule simulator (planner.schedule) as the cost model calls it: step times of K
candidates that share (schedule, p, v), batched per micro-batch count; activation peaks per rank
from a schedule's op order; Megatron-Core's combined 1F1B (reference/pipeline_schedules.md §0,
§4, §6-§11).

Times: per-stage forward F, input-gradient I and weight-gradient W seconds, (K, S) with
S = p*v stages in chain order (stage 0 holds the embedding, stage S-1 the loss, whatever rank
holds it); a full backward B = I + W. ``c``: the point-to-point latency of one hop, seconds,
(K,). Step times are T_sync (every rank starts at 0, the step ends with the last op of any
rank: a global synchronisation precedes the optimizer step, the frameworks' default;
schedule/simulate.py).

Micro-batches: a step is simulated as it is up to m_a + d micro-batches, and beyond extended by
the period per micro-batch of the steady state: T(m) = T(m_a) + (m - m_a) x max(the slope of T
over m_a .. m_a + d, the busiest rank's work per micro-batch, which no slope can be below), with
(m_a, d) = (3p, 2) for DualPipeV and DualPipe, (4p, 2) for ZB-V, (p, 1) for GPipe and (p^2, p)
for interleaved zero bubble (extension_base). Once the steady state has settled by m_a (the op
orders repeat one pattern per micro-batch, or per round of p for interleaved zero bubble) that
is exact; tests/test_schedule_cost.py checks it against the full simulation on stage times of
the cost model's shape (equal stages, the embedding's and the loss's heavier) up to m = 40p.
Measured against the full simulation to m = 20p-24p, on those shapes and on random per-stage
times (0.3-1.5, p = 2 to 32, v up to 16): relative error below 1e-13 from these bases, except
ZB-V at p = 16 on the cost model's shapes, 1.2% (as from 6p, the base before; 3p was 1.2-2.1%
off at p = 2-16) and DualPipeV at p = 32 on random times, 9.4e-4. Looped BFS is not extended
(with random times it had not settled by 8p: 0.3% at p = 8, v = 16), nor are 1F1B and
interleaved 1F1B, whose closed forms the search uses (extend=False: every m simulated, the
exact path). Graph building is what costs (20-50 us an op, schedule/graph.py): m = 2048
micro-batches would take seconds, m_a a few ms; with ZB-V at 6p a Llama 3 405B torchtitan
search on 512 GPUs took 16 s, most of it the p = 64 graphs.
"""

from __future__ import annotations

import numpy as np

from ..framework_spec import PIPELINE_SCHEDULES
from ..schedule import build_schedule, simulate_batch
from ..schedule.graph import memory_profile, peak_memory

# (m_a, d) of the extension per p (module docstring): DualPipe(V) take m >= 2p, d = 2 is one
# micro-batch per direction of DualPipe; interleaved zero bubble takes m in rounds of
# m // p (p^2 and p^2 + p both whole rounds)
EXTENSION = {"dualpipe": lambda p: (3 * p, 2), "dualpipev": lambda p: (3 * p, 2),
             "zbv": lambda p: (4 * p, 2), "gpipe": lambda p: (p, 1),
             "interleaved-zero-bubble": lambda p: (p * p, p)}


def microbatch_group(m: int, pp: int) -> int:
    """Megatron-Core's micro-batch group G of the interleaved schedule for m micro-batches on pp
    stages: pp when pp divides m, else the least G with pp <= G <= m and m mod G either 0 or
    >= pp (megatron/core/pipeline_parallel/schedules.py L1160-1180). m = 10, pp = 4: 5;
    m = 9, pp = 4: 5 (9 mod 5 = 4). ValueError if m < pp."""
    for group in range(pp, m + 1):
        if m % group == 0 or m % group >= pp:
            return group
    raise ValueError(f"{m} micro-batches cannot be interleaved on {pp} stages")


def extension_base(name: str, p: int) -> tuple[int, int] | None:
    """(m_a, d): the two micro-batch counts m_a and m_a + d whose simulated steps extend to
    longer ones (module docstring), or None for a schedule that is not extended. Ints."""
    return EXTENSION[name](p) if name in EXTENSION else None


def extends(name: str, p: int, m: np.ndarray) -> np.ndarray:
    """Where a step of ``m`` micro-batches is extended rather than simulated as it is: m beyond
    m_a + d for a schedule with an extension (extension_base). Bool array of m's shape."""
    base = extension_base(name, p)
    m = np.asarray(m)
    return np.zeros(m.shape, dtype=bool) if base is None else m > sum(base)


def _schedule(name: str, p: int, m: int, v: int):
    """The op order of ``name`` on (p, m, v), or None where the generator refuses it (a layout
    the search's rules drop, evaluated beside valid ones in a sub-grid: it costs infinity).
    Interleaved 1F1B: Megatron-Core's order with its group (microbatch_group; PyTorch's rounds
    give the same order where both run, reference §3)."""
    try:
        g = microbatch_group(int(m), p) if name == "interleaved-1f1b" and m >= p else None
        return build_schedule(name, p, int(m), v, g)
    except ValueError:
        return None


def op_order(name: str, p: int, m: int, v: int):
    """The op order (planner.schedule.Schedule) the cost model simulates for ``name`` on
    (p, m, v): interleaved 1F1B with Megatron-Core's group (microbatch_group). ValueError (one
    line) where the generator refuses it."""
    sched = _schedule(name, p, m, v)
    if sched is None:
        raise ValueError(f"{name} cannot run p={p}, m={m}, v={v} (its generator's constraints)")
    return sched


def _run(name: str, p: int, m: int, v: int, F, I, W, c):
    """(T_sync (K,), busy (K, p)) of ``name`` on (p, m, v) with per-stage F, I, W (K, S) and
    c (K,); infinite where the generator refuses (p, m, v)."""
    sched = _schedule(name, p, m, v)
    if sched is None:
        return np.full(len(F), np.inf), np.full((len(F), p), np.inf)
    result = simulate_batch(sched, F, I=I, W=W, c=np.asarray(c, dtype=np.float64)[:, None])
    return result.t_sync, result.busy


def simulated_steps(name: str, p: int, v: int, m: np.ndarray, F: np.ndarray, I: np.ndarray,
                    W: np.ndarray, c: np.ndarray,
                    extend: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(T_sync, the busiest rank's work) of K steps of schedule ``name``
    (planner.schedule.SCHEDULES) on p ranks with v chunks each: ``m`` (K,) micro-batches per
    step, F, I, W (K, p*v) per-stage seconds, c (K,) seconds per hop. Simulated per distinct m
    (each a batch); with ``extend``, extended beyond m_a + d (module docstring). Seconds, (K,)
    each; infinite where the generator refuses (p, m, v)."""
    m = np.asarray(m, dtype=np.int64)
    out, work = np.zeros(m.shape), np.zeros(m.shape)
    ext = extends(name, p, m) & extend
    for count in np.unique(m[~ext]).tolist():
        sel = ~ext & (m == count)
        t_sync, busy = _run(name, p, count, v, F[sel], I[sel], W[sel], c[sel])
        out[sel], work[sel] = t_sync, busy.max(axis=1)
    if np.any(ext):
        m_a, d = extension_base(name, p)
        args = (F[ext], I[ext], W[ext], c[ext])
        (t_a, busy_a), (t_b, busy_b) = _run(name, p, m_a, v, *args), _run(name, p, m_a + d, v, *args)
        with np.errstate(invalid="ignore"):                     # inf - inf where refused
            busy = np.nan_to_num((busy_b - busy_a) / d, nan=np.inf)   # (K, p) per micro-batch
            period = np.maximum(np.nan_to_num((t_b - t_a) / d, nan=np.inf), busy.max(axis=1))
        out[ext] = t_a + (m[ext] - m_a) * period
        work[ext] = (busy_a + (m[ext] - m_a)[:, None] * busy).max(axis=1)
    return out, work


def closed_peak_chunks(code, p, m, v, rank, gamma) -> np.ndarray:
    """peak_chunks' closed forms, vectorized over candidates (codes of
    framework_spec.PIPELINE_SCHEDULES; p, m, v, rank, gamma broadcast); NaN where none applies
    (ZB-V with m < 2p - 1, and 1F1B / interleaved 1F1B: cost.pipeline's). Float array."""
    code, p, v, r = (np.asarray(x) for x in (code, p, v, rank))
    m, gamma = np.asarray(m, dtype=np.float64), np.asarray(gamma, dtype=np.float64)
    mpr = np.floor(m / np.maximum(1.0, np.floor(m / np.maximum(p, 1))))
    name = lambda n: code == PIPELINE_SCHEDULES.index(n)  # noqa: E731
    return np.select(
        [name("gpipe") | name("looped-bfs"), name("interleaved-zero-bubble") & (m >= p),
         name("zbv") & (m >= 2 * p - 1), name("dualpipev"), name("dualpipe")],
        [m * v, (v - 1) * mpr + p - r + gamma * r, 2.0 * p, 2.0 * p + 1, p + 1.0], np.nan)


def peak_chunks(name: str, p: int, m: int, v: int, rank: int, gamma) -> np.ndarray:
    """Peak activation of pipeline rank ``rank`` in chunks (a chunk holds L/(p*v) layers' worth):
    chunks whose F started and whose I or B has not ended, plus ``gamma`` (scalar or (K,)) x
    those between their I and W (reference §0.3 rule 4), as the op order of (p, m, v) gives
    them: GPipe and looped BFS m*v (every chunk of every micro-batch); interleaved zero bubble
    (v - 1)*mpr + p - r + gamma*r with mpr = m // max(1, m // p) (m >= p); ZB-V 2p for
    m >= 2p - 1; DualPipeV 2p + 1 and DualPipe p + 1 (m >= 2p), whatever gamma (reference
    §8-§11, TV6-TV9; tests/test_schedule_cost.py checks each against the simulated order on a
    range of p, m, v, gamma); elsewhere the simulated order itself (schedule.graph
    memory_profile). For (p, m, v) the generator takes (cost.pipeline.schedule_runs). Float
    array of gamma's shape."""
    gamma = np.asarray(gamma, dtype=np.float64)
    closed = {"gpipe": m * v, "looped-bfs": m * v, "dualpipev": 2 * p + 1, "dualpipe": p + 1,
              "zbv": 2 * p if m >= 2 * p - 1 else None}.get(name)
    if name == "interleaved-zero-bubble" and m >= p:
        return (v - 1) * (m // max(1, m // p)) + p - rank + gamma * rank
    if closed is not None:
        return np.full(gamma.shape, float(closed))
    sched = _schedule(name, p, m, v)
    if sched is None:
        return np.full(gamma.shape, np.inf)
    return peak_memory([memory_profile(_Order(sched))[2][rank]], gamma)[..., 0]


class _Order:
    """What schedule.graph.memory_profile reads of a graph: the schedule's op order (the
    profile depends on the order only), without building the dependency graph."""

    def __init__(self, sched):
        self.sched = sched


def combined_1f1b_makespan(p: int, m: int, v: int, F, B, FB, c=0.0, g: int | None = None):
    """Step time (T_sync) of Megatron-Core's combined 1F1B, the schedule its EP communication
    overlap (--overlap-moe-expert-parallel-comm) runs: the interleaved order (PP = 1: F0,
    [F1&B0], ..., B(m-1)) with one extra warm-up forward per rank and every steady-state
    forward and backward merged into one node of ``FB`` seconds (reference §4; Megatron-LM
    @d98e8a64 schedules.py L966-970, L1485-1508, combined_1f1b.py L35-136). F, B, FB:
    per-stage seconds, scalars, (S,) with S = p*v or (K, S); FB is indexed by the forward
    member's stage (t_FB: F + B where nothing overlaps, less the all-to-all time hidden
    behind the other micro-batch's compute). c: seconds per hop. g: Megatron's micro-batch
    group (default p). The full m is simulated. Returns (T_sync (K,), peak in-flight chunks
    per rank (p,)). ValueError (one line) where VPP is missing with p > 1 or g is invalid.
    TV10: p=4, v=2, m=8, chunk F=1, B=2, FB=3 -> 57; FB=2 -> 46."""
    sched = build_schedule("megatron-combined-1f1b", p, m, v, g)
    result = simulate_batch(sched, F, B=B, FB=FB, c=c)
    return result.t_sync, result.peak_inflight_chunks
