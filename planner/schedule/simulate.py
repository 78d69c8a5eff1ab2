"""Event simulation of a pipeline schedule's op order (reference/pipeline_schedules.md §0.3).

Rules: each rank runs its ops in order on one compute stream; F(s,j) waits for F(s-1,j);
I/B(s,j) waits for I/B(s+1,j), or for F(s,j) on the last stage; W(s,j) waits for I(s,j);
an overlapped pair FB waits for both members' dependencies and lasts t_FB; an edge between
stages on different ranks adds the point-to-point latency c of its rank boundary. An op starts
at max(rank free, dependencies done + c). Event times are a max-plus recurrence over a fixed
graph, evaluated level by level (each level holds at most one op per rank).

Optimizer-step convention: every rank starts at time 0. T_sync is the end of the last op on any
rank: the step time when a global synchronisation (grad-norm or inf/NaN all-reduce across the
pipeline ranks) precedes the optimizer step, the default of the frameworks and of plan3d.
T_span is the largest (last end - first start) of one rank: the steady-state period when
iterations tile as a parallelogram, which needs optimizer post-validation (sail-sg
--enable-optimizer-post-validation; reference §0.2). Bubble = T - busiest rank's work.

Times are per stage (virtual stage: one chunk of L/(p*v) layers), in seconds or in any one
unit (the test vectors use dimensionless stage-time units); memory is counted in chunks and
reported in units of A, the activation of one stage of L/p layers (a chunk holds A/v).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .graph import duration_table, graph, latency_table, peak_memory
from .orders import Schedule

_RING_BYTES = 64 * 2**20     # the batched evaluation runs K in slices whose ring fits this

class Transfer(NamedTuple):
    """A point-to-point transfer on a cross-rank edge with latency c > 0: activations ("F") or
    gradients ("B") of ``microbatch`` from rank ``src`` to rank ``dst``, during [start, end]."""
    src: int
    dst: int
    kind: str
    microbatch: int
    start: float
    end: float


class Event(NamedTuple):
    """One simulated op: rank, kind, micro-batch, chunk (of the rank), start, end, its stage and
    direction; for FB the forward member's and ``back`` = (micro-batch, chunk, direction) of the
    backward member."""
    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float
    stage: int = 0
    direction: int = 0
    back: tuple[int, int, int] | None = None




@dataclass(frozen=True)
class SimResult:
    """One simulated step. Times in the unit of the inputs. ``busy``/``idle`` (p,) per rank,
    idle = t_sync - busy; ``bubble`` = t_sync - max busy, ``bubble_span`` = t_span - max busy;
    peaks (p,) per rank: ``peak_inflight`` and ``peak_memory`` (in-flight + gamma * pending W)
    in units of A, ``peak_inflight_chunks`` and ``peak_pending_w`` in chunks; ``param_copies``
    (2 for DualPipe); ``events`` every op with its times; ``transfers`` the p2p transfers."""
    schedule: Schedule
    t_sync: float
    t_span: float
    busy: np.ndarray
    idle: np.ndarray
    bubble: float
    bubble_span: float
    peak_inflight: np.ndarray
    peak_inflight_chunks: np.ndarray
    peak_pending_w: np.ndarray
    peak_memory: np.ndarray
    gamma: float
    param_copies: int
    events: tuple[Event, ...]
    transfers: tuple[Transfer, ...] = ()

    @property
    def step_time(self) -> float:
        """T_sync, plan3d's default convention (module docstring)."""
        return self.t_sync


@dataclass(frozen=True)
class BatchResult:
    """K simulated steps of one schedule: ``t_sync``, ``t_span``, ``bubble``, ``bubble_span``
    (K,); ``busy``, ``idle`` (K, p); peaks as in SimResult, (p,) (op-order only; peak_memory
    (K, p) when gamma is (K,))."""
    schedule: Schedule
    t_sync: np.ndarray
    t_span: np.ndarray
    busy: np.ndarray
    idle: np.ndarray
    bubble: np.ndarray
    bubble_span: np.ndarray
    peak_inflight: np.ndarray
    peak_inflight_chunks: np.ndarray
    peak_pending_w: np.ndarray
    peak_memory: np.ndarray
    gamma: float | np.ndarray
    param_copies: int


class _Plan:
    """Level-by-level arrays of the batched evaluation. End times live in a ring of W blocks of
    p rows (row = block of the op's level * p + its rank; W = 1 + the longest level distance
    read, so a row is overwritten only after its last reader); row ``zero`` holds 0. A level
    whose p ranks all ran at the level before reads the previous block as a view."""

    def __init__(self, g):
        p, level, firsts = g.p, g.level, set(g.start_of_rank[:-1])
        lasts = {g.start_of_rank[r + 1] - 1 for r in range(p)
                 if g.start_of_rank[r + 1] > g.start_of_rank[r]}
        dist = [level[n] - level[n - 1] for n in range(g.n) if n not in firsts]
        dist += [level[n] - level[d] for n in range(g.n) for d, _ in g.ext[n]]
        self.W, self.p = max(dist, default=0) + 1, p
        self.zero = self.W * p
        row = [int(level[n] % self.W) * p + g.rank[n] for n in range(g.n)]
        self.levels = [self._level(g, lv, nodes.tolist(), row, firsts, lasts)
                       for lv, nodes in enumerate(g.levels)]

    def _level(self, g, lv, nodes, row, firsts, lasts):
        p, zero = self.p, self.zero
        arr = lambda xs: np.asarray(xs, dtype=np.intp)  # noqa: E731
        prev = [row[x - 1] if x not in firsts else zero for x in nodes]
        dep = [g.ext[x][0] if g.ext[x] else (None, -1) for x in nodes]
        lat = [b if b >= 0 else p for _, b in dep]
        two = [(i, row[d], b if b >= 0 else p) for i, x in enumerate(nodes)
               if len(g.ext[x]) > 1 for d, b in g.ext[x][1:]]
        base = int(lv % self.W) * p
        fast = len(nodes) == p and all(x not in firsts and g.level[x - 1] == lv - 1
                                       for x in nodes)
        pick = lambda keep: tuple(arr(c) for c in zip(*[(i, g.rank[x]) for i, x in  # noqa: E731
                                                       enumerate(nodes) if x in keep])) or None
        return (base, fast, None if fast else arr([row[x] for x in nodes]),
                int(((lv - 1) % self.W) * p) if fast else arr(prev),
                arr([row[d] if d is not None else zero for d, _ in dep]),
                arr(lat) if any(b < p for b in lat) else None, arr([g.col[x] for x in nodes]),
                tuple(arr(c) for c in zip(*two)) if two else None, pick(firsts), pick(lasts))


def _run_batch(plan: _Plan, D: np.ndarray, LAT: np.ndarray | None):
    """(last end (p, K), first start (p, K)) by the max-plus recurrence, level by level:
    start = max(end of rank's previous op, dependency end + latency); end = start + duration.
    Four to six numpy calls on (ops in level, K) arrays per level, in place where possible."""
    K, dt, p = D.shape[1], D.dtype, plan.p
    ring = np.zeros((plan.zero + 1, K), dtype=dt)
    first, last = np.zeros((p, K), dtype=dt), np.zeros((p, K), dtype=dt)
    for base, fast, out, prev, dep, lat, col, two, firsts, lasts in plan.levels:
        t = ring[dep]
        if LAT is not None and lat is not None:
            t += LAT[lat]
        if fast:
            s = ring[base:base + p]
            np.maximum(ring[prev:prev + p], t, out=s)
        else:
            s = ring[prev]
            np.maximum(s, t, out=s)
        if two is not None:
            t2 = ring[two[1]]
            if LAT is not None:
                t2 += LAT[two[2]]
            s[two[0]] = np.maximum(s[two[0]], t2)
        if firsts is not None:
            first[firsts[1]] = s[firsts[0]]
        s += D[col]
        if not fast:
            ring[out] = s
        if lasts is not None:
            last[lasts[1]] = s[lasts[0]]
    return last, first


def _run_single(g, dur: list, lat: list):
    """(start, end) lists per node, pure Python, in topological (level) order."""
    start, end, firsts = [0.0] * g.n, [0.0] * g.n, set(g.start_of_rank[:-1])
    for nodes in g.levels:
        for n in nodes.tolist():
            t = 0.0 if n in firsts else end[n - 1]
            for d, b in g.ext[n]:
                t = max(t, end[d] + (lat[b] if b >= 0 else 0.0))
            start[n], end[n] = t, t + dur[n]
    return start, end


def _cases(*arrays) -> int:
    """K: the leading size of the 2-D inputs (gamma passed as (K, 1)); 1 when there are none."""
    sizes = {np.shape(a)[0] for a in arrays if a is not None and np.ndim(a) == 2}
    sizes.discard(1)
    if len(sizes) > 1:
        raise ValueError(f"inputs disagree on the number of cases K: {sorted(sizes)}")
    return sizes.pop() if sizes else 1


def simulate_batch(sched: Schedule, F, B=None, I=None, W=None, FB=None, c=0.0, gamma=0.0,
                   dtype=np.float64) -> BatchResult:
    """Simulate ``sched`` for K time vectors at once (numpy, vectorized over K).

    F, B, I, W, FB: per-stage times, each a scalar, (S,) per stage (S = p*v virtual stages,
    stage order of the chain), (K, 1) or (K, S); B defaults to I + W; FB (overlapped pair)
    is indexed by the forward member's stage and defaults to F + B of the two members. c:
    latency per rank boundary (scalar, (p,), (p-1,) without wrap, (K, 1) or (K, p)). gamma:
    share of a chunk's activation held between its I and W, scalar or (K,). dtype float64 or
    float32 (faster, ~1e-7 relative error). Same units in and out (seconds or stage times).
    t_sync is the step time (a global synchronisation before the optimizer step), t_span the
    parallelogram period (post-validation); see the module docstring. ValueError on bad
    shapes, negative times, missing kinds or a deadlocking order."""
    g = graph(sched)
    K = _cases(F, B, I, W, FB, c, np.reshape(gamma, (-1, 1)) if np.ndim(gamma) == 1 else None)
    D = duration_table(g, K, F, B, I, W, FB).astype(dtype, copy=False)
    LAT = latency_table(sched, K, c)
    LAT = None if LAT is None else LAT.astype(dtype)
    if g.__dict__.get("_plan") is None:
        g._plan = _Plan(g)
    step = max(1, _RING_BYTES // ((g._plan.zero + 1) * D.itemsize))   # bound the ring's memory
    parts = [_run_batch(g._plan, D[:, k:k + step], None if LAT is None else LAT[:, k:k + step])
             for k in range(0, K, step)]
    last, first = (np.concatenate(x, axis=1) for x in zip(*parts))
    busy = (g.counts @ D.astype(np.float64, copy=False)).T
    t_sync, t_span = last.max(axis=0), (last - first).max(axis=0)
    inflight, pending, points = g.memory
    top = busy.max(axis=1)
    return BatchResult(sched, t_sync, t_span, busy, t_sync[:, None] - busy, t_sync - top,
                       t_span - top, inflight * sched.chunk_fraction, inflight, pending,
                       peak_memory(points, gamma) * sched.chunk_fraction, gamma,
                       sched.param_copies)


def simulate(sched: Schedule, F, B=None, I=None, W=None, FB=None, c=0.0,
             gamma=0.0) -> SimResult:
    """Simulate one case of ``sched`` in pure Python and keep every event. Inputs as in
    simulate_batch with K = 1 (scalars or (S,) times, scalar or (p,) c, scalar gamma);
    t_sync / t_span as there. ValueError as there."""
    g = graph(sched)
    D = duration_table(g, 1, F, B, I, W, FB)[:, 0]
    LAT = latency_table(sched, 1, c)
    lat = [0.0] * sched.p if LAT is None else LAT[:-1, 0].tolist()
    start, end = _run_single(g, D[g.col].tolist(), lat)
    p, events = sched.p, []
    for n, (r, (members, kind)) in enumerate(zip(g.rank, g.members)):
        op = sched.ranks[r][n - g.start_of_rank[r]]
        events.append(Event(r, kind, op.mb, op.chunk, start[n], end[n], members[0][2],
                            op.direction, op.back))
    bounds = [(g.start_of_rank[r], g.start_of_rank[r + 1]) for r in range(p)]
    last = [end[b - 1] if b > a else 0.0 for a, b in bounds]
    t_sync = max(last)
    t_span = max(end[b - 1] - start[a] if b > a else 0.0 for a, b in bounds)
    busy = g.counts @ D
    inflight, pending, points = g.memory
    top = float(busy.max())
    transfers = tuple(Transfer(g.rank[d], g.rank[n], kind, j, end[d], end[d] + lat[b])
                      for n, d, b, kind, j in g.edges if lat[b] > 0)
    return SimResult(sched, t_sync, t_span, busy, t_sync - busy, t_sync - top, t_span - top,
                     inflight * sched.chunk_fraction, inflight, pending,
                     peak_memory(points, float(gamma)) * sched.chunk_fraction, float(gamma),
                     sched.param_copies, tuple(events), transfers)


def memory_curve(result: SimResult, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(times, activation in A units) of ``rank`` as a step function: +A/v at an F (or FB)
    start, -A/v at a B (or FB) end, -(1-gamma)A/v at an I end, -gamma*A/v at a W end
    (reference §0.3 rule 4, §0.4). Frees at time t come before allocations at t; one point
    per instant (the value after both). Shapes (n,), (n,)."""
    unit, gam = result.schedule.chunk_fraction, result.gamma
    steps = []
    for e in result.events:
        if e.rank != rank:
            continue
        if e.kind in ("F", "FB"):
            steps.append((e.start, 1, unit))
        free = {"B": unit, "FB": unit, "I": (1 - gam) * unit, "W": gam * unit}.get(e.kind)
        if free:
            steps.append((e.end, 0, -free))
    steps.sort()
    times = np.array([0.0] + [t for t, _, _ in steps])
    values = np.cumsum([0.0] + [d for _, _, d in steps])
    keep = np.append(times[1:] != times[:-1], True)       # one point per instant: the last
    return times[keep], values[keep]
