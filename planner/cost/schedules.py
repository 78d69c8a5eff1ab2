"""The step time of the simulated pipeline schedules (GPipe, looped BFS, interleaved zero bubble,
ZB-V, DualPipeV, DualPipe): per-stage F, I, W seconds from the cost model's per-rank terms and
the simulator (cost.schedule_sim), batched over the candidates that share (schedule, pp, vpp)
(reference/pipeline_schedules.md §0-§11).

1F1B and interleaved 1F1B keep their closed forms (pipeline.pipeline_time, formulas.md 6: exact
for equal stages, which tests/test_schedule_properties.py checks against the simulator).

Per stage (chain order: stage 0 the embedding's, S-1 = pp*vpp - 1 the loss's, whichever rank
holds it, pipeline.holds_head): the per-micro-batch seconds of the rank kind that holds it under
the looped placement (first, middle, last: cost.step's totals), its blocks in proportion to the
stage's layers (LayoutDegrees.rank_chunk_layers), the rank's per-micro-batch overheads (blocking
p2p, exposed ZeRO, offload) spread over its vpp chunks, and the edge work (embedding and output
layer with their TP collectives, the loss) on stages 0 and S-1. Split:
    W = the weight-gradient GEMMs (compute.LayerTimes.gemm_forward per block: one of the
        backward's two GEMMs of every linear layer);
    F = the forward kernels + half of what is neither kernel nor recompute (exposed TP, CP, EP
        communication, edges, overheads: the backward runs the transposes of the forward's
        collectives, cost.volumes);
    I = the rest (the other backward kernels, recomputation, the other half).
Point-to-point: every schedule is charged alike, as comm.RankComm charges 1F1B and interleaved
1F1B: transfers that block (p2p_per_microbatch) are part of the ops' time, overlapped ones
(p2p_fill: the fill and drain of 2 (pp - 1) transfers, once per step) are added to the step
beside the simulated order, which runs without latency (c = 0). The simulator's own per-hop
latency (c = the link time of one transfer, p2p_hop) is not used here: under a fixed op order it
makes the steady state latency-bound (reference, open items: 1F1B p=4, m=8 from 33 to 37 at
c = 0.25) for every schedule, and 1F1B and interleaved 1F1B, costed in closed form, would not
pay it; the search would then compare unlike with unlike. The step's pipeline part is the
simulated T_sync; the bubble what it holds beyond the busiest rank's work (reference §0.2),
with the step's per-micro-batch terms scaled to that work (simulated_makespan).
"""

from __future__ import annotations

import numpy as np

from ..framework_spec import PIPELINE_SCHEDULES
from ..layout import Candidates
from ..layout.axes import AXES
from ..layout.degrees import EVERY_CHUNK
from . import pipeline
from .schedule_sim import simulated_steps

KINDS = ("first", "middle", "last")


def kind_terms(times: dict, counts: dict, work: dict, extra: dict) -> dict[str, dict]:
    """Per rank kind, per micro-batch (broadcast arrays, seconds): ``blocks`` (its blocks, all
    terms), ``fwd`` / ``bwd`` (forward / backward kernels), ``wgrad`` (weight-gradient GEMMs),
    ``recompute``, ``edge`` (output layer and edge TP collectives), ``overhead`` (blocking p2p,
    exposed per-micro-batch ZeRO, offload). ``work``: {kind: (blocks, recompute)} as cost.step
    sums them (its recompute share); ``times``: compute.block_times; ``counts``: blocks per
    rank kind; ``extra``: step.rank_extra's terms."""
    out = {}
    for kind in KINDS:
        blocks, recompute = work[kind]
        mine = counts[kind]
        ex = extra[kind]
        out[kind] = {
            "blocks": blocks, "recompute": recompute,
            "fwd": sum(mine[b] * times[b].forward for b in mine),
            "bwd": sum(mine[b] * times[b].backward for b in mine),
            "wgrad": sum(mine[b] * times[b].gemm_forward for b in mine),
            "edge": ex.get("compute", 0.0) + ex.get("tp_comm", 0.0),
            "overhead": ex.get("pp_comm", 0.0) + ex.get("dp_comm", 0.0) + ex.get("offload", 0.0)}
    return out


def _chain(p: int, v: int, v_shape: bool) -> list[tuple[int, int]]:
    """(chunk, rank) of each stage s of the chain, in order: looped placement s = chunk*p +
    rank; V-shaped (ZB-V, DualPipeV, v = 2) stage s < p on rank s, stage s >= p on rank
    2p-1-s (planner.schedule's placement "v")."""
    if v_shape:
        return [(0, s) for s in range(p)] + [(1, p - 1 - j) for j in range(p)]
    return [(chunk, rank) for chunk in range(v) for rank in range(p)]


def _stage_layers(cg, num_layers: int, chain: list[tuple[int, int]]) -> np.ndarray:
    """(K, S) layers of each stage of ``chain`` (_chain): its rank's full chunk, one less for
    a short one (LayoutDegrees.rank_chunk_layers)."""
    cols = []
    for chunk, rank in chain:
        full, short = cg.rank_chunk_layers(num_layers, rank)
        short = np.asarray(short)
        cols.append(np.asarray(full, dtype=np.float64) - ((short == chunk) | (short == EVERY_CHUNK)))
    return np.stack(np.broadcast_arrays(*cols), axis=1)


def stage_times(terms: dict, cg, num_layers: int, p: int, v: int):
    """(F, I, W), each (K, S): per-stage seconds of K candidates ``cg`` (flat Candidates with
    pp = p, vpp = v, one schedule) from their kind ``terms`` (kind_terms, taken at the
    candidates: (K,) arrays), in chain order (_chain); module docstring. S = p*v. A rank's
    edge work sits on its edge stage: rank 0's on stage 0 and the last rank's on S-1, except
    in the V shapes, where rank 0 holds both and its edge work (the loss's) sits on S-1."""
    v_shape = bool(np.all(pipeline.v_shaped(cg))) and v == 2
    chain = _chain(p, v, v_shape)
    layers = _stage_layers(cg, num_layers, chain)
    last = len(chain) - 1
    F, I, W = (np.zeros(layers.shape) for _ in range(3))
    for s, (_, rank) in enumerate(chain):
        kind = "first" if rank == 0 else "last" if rank == p - 1 else "middle"
        t = terms[kind]
        at = {"first": 0, "middle": 1, "last": p - 1}[kind]  # the kind's rank, as its terms
        share = layers[:, s] / np.maximum(cg.rank_layers(num_layers, at), 1e-30)
        if v_shape:
            edge = terms["first"]["edge"] if s == last else 0.0
        else:
            edge = terms["first"]["edge"] if s == 0 else terms["last"]["edge"] if s == last else 0.0
        other = (t["blocks"] - t["fwd"] - t["bwd"] - t["recompute"]) * share + t["overhead"] / v + edge
        total = t["blocks"] * share + t["overhead"] / v + edge
        F[:, s] = t["fwd"] * share + 0.5 * other
        W[:, s] = t["wgrad"] * share
        I[:, s] = total - F[:, s] - W[:, s]
    return F, np.maximum(I, 0.0), W


def _flat_candidates(c, at, shape) -> Candidates:
    """Flat Candidates of the broadcast candidates ``c`` at flat positions ``at`` of ``shape``;
    a field that varies along an axis ``shape`` does not (one that no term of the pipeline
    time depends on, e.g. the ZeRO stage) takes its first value there."""
    index = np.unravel_index(at, shape)

    def field(a):
        a = np.asarray(a)
        a = a.reshape((1,) * (len(shape) - a.ndim) + a.shape)
        cut = tuple(slice(0, 1) if n == 1 else slice(None) for n in shape)
        return np.broadcast_to(a[cut], shape)[index]
    return Candidates(**{a.name: field(getattr(c, a.name)) for a in AXES})


def p2p_hop(c, fill) -> np.ndarray:
    """The link time of one point-to-point transfer, seconds: the overlapped fill and drain
    (comm.RankComm.p2p_fill) is 2 (pp - 1) of them; 0 where the transfers block (they are in
    the ops' time) or pp = 1. What the simulator's per-hop latency c is for a what-if (the
    timeline's --latency). Broadcast array."""
    return np.asarray(fill, dtype=np.float64) / (2.0 * np.maximum(np.asarray(c.pp) - 1, 1))


# Schedules whose step no closed form gives (reference §8, §10, §11: "simulate"); the others
# beyond 1F1B and interleaved 1F1B have one that is exact for equal stages (closed_form_step)
SIMULATED_STEP = tuple(PIPELINE_SCHEDULES.index(n) for n in ("zbv", "dualpipev", "dualpipe"))
_IZB = PIPELINE_SCHEDULES.index("interleaved-zero-bubble")


def zero_bubble_ratio(terms: dict) -> np.ndarray:
    """max(F + I - W, F, I) / (F + I + W) of a middle rank's micro-batch (its chunks alike): the
    share of interleaved 1F1B's bubble, (p - 1)(F + I + W) in chunk times, that interleaved zero
    bubble keeps, (p - 1) max(F + I - W, F, I) (reference §9, TV7: 3 of 9 at unit times).
    Broadcast array."""
    t = terms["middle"]
    total = t["blocks"] + t["overhead"] + t["edge"]
    f = t["fwd"] + 0.5 * (total - t["fwd"] - t["bwd"] - t["recompute"])
    w = t["wgrad"]
    i = total - f - w
    return np.maximum(np.maximum(f + i - w, f), i) / np.maximum(total, 1e-30)


def scheduled_makespan(num_layers: int, c, m, terms: dict, totals: dict, t_pipe, bubble,
                       fill, where=None, exact: bool = False,
                       record: list | None = None) -> tuple[np.ndarray, ...]:
    """(pipeline time, bubble, p2p fill, work scale) of candidates ``c`` where their schedule is
    one beyond 1F1B and interleaved 1F1B (pipeline.simulated); the inputs (cost.step's closed
    forms, which treat vpp = 1 as 1F1B and vpp > 1 as interleaved) and scale 1 elsewhere.
    GPipe and looped BFS take them as they are (equal to 1F1B's and interleaved's for equal
    stages, m >= p: reference §1, §5); interleaved zero bubble keeps zero_bubble_ratio of the
    bubble (§9, exact for equal stages); ZB-V, DualPipeV and DualPipe are simulated
    (simulate_steps), and with ``exact`` every schedule of pp > 1 is, 1F1B and interleaved
    included, each m as it is (the timeline's step: per-stage times, uneven ones included,
    through the whole op order).
    ``terms``: kind_terms; ``totals``: per rank kind, the per-micro-batch seconds; ``m``
    micro-batches; ``where``: the layouts whose step is wanted (None: all; elsewhere a
    simulated one is infinite); ``record``: a list that receives the simulated groups' inputs
    (simulate_steps). Seconds (scale: a ratio), broadcast shape of the inputs."""
    code = np.asarray(c.pipeline_schedule)
    izb = (code == _IZB) & pipeline.simulated(c) & (not exact)
    if np.any(izb):
        ratio = zero_bubble_ratio(terms)
        t_pipe = np.where(izb, t_pipe - bubble * (1.0 - ratio), t_pipe)
        bubble = np.where(izb, bubble * ratio, bubble)
    sim = np.isin(code, SIMULATED_STEP) & (np.asarray(c.pp) > 1)
    if exact:  # pp = 1 too: its one rank runs 1F1B's F0 B0 F1 B1 ...
        sim = np.ones(np.shape(code), dtype=bool)
    if not np.any(sim):
        return t_pipe, bubble, fill, 1.0
    return simulate_steps(num_layers, c, m, terms, totals, (t_pipe, bubble, fill), sim, where,
                          extend=not exact, record=record)


def _wanted(sim, runs, where, shape) -> np.ndarray:
    """Where to simulate: ``sim`` and ``runs`` (the generator takes the layout) and ``where``,
    which along an axis the pipeline time does not vary on counts where any of it is True."""
    todo = np.broadcast_to(sim, shape) & np.broadcast_to(runs, shape)
    if where is None:
        return todo
    w = np.asarray(where)
    w = w.reshape((1,) * (len(shape) - w.ndim) + w.shape)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and w.shape[i] > 1)
    return todo & np.broadcast_to(w.any(axis=axes, keepdims=True) if axes else w, shape)


def simulate_steps(num_layers: int, c, m, terms: dict, totals: dict, closed: tuple, sim,
                   where=None, extend: bool = True,
                   record: list | None = None) -> tuple[np.ndarray, ...]:
    """scheduled_makespan's simulation: at the candidates ``sim`` (bool, broadcast) that
    ``where`` wants and whose generator takes them, the simulated T_sync (module docstring), the
    bubble T - the busiest rank's work (reference §0.2) and the scale = that work /
    (m x max(totals)), which takes the step's per-micro-batch terms (the slowest rank kind's,
    under the looped placement) to the busiest rank's work (the V shapes pair the loss's stage
    with the embedding's on rank 0); infinite at the other ``sim``; ``closed`` = (t_pipe,
    bubble, fill) elsewhere, the fill kept. ``extend``: long steps extended from a short one
    (schedule_sim.simulated_steps); False simulates every m as it is. ``record``: a list that
    receives, per simulated group, (schedule, p, v, m (K,), F, I, W (K, p*v), flat positions):
    the op times a timeline draws. Seconds (scale: a ratio), broadcast arrays."""
    slowest = np.maximum(np.maximum(totals["first"], totals["middle"]), totals["last"])
    shape = np.broadcast_shapes(*(np.shape(x) for x in closed), np.shape(slowest), np.shape(sim),
                                np.shape(c.pipeline_schedule), np.shape(c.pp), np.shape(c.vpp),
                                np.shape(m), *(np.shape(x) for t in terms.values() for x in t.values()))
    at = np.flatnonzero(_wanted(sim, pipeline.schedule_runs(c, m), where, shape))
    index = np.unravel_index(at, shape)
    pick = lambda a: np.broadcast_to(np.asarray(a, dtype=np.float64), shape)[index]  # noqa: E731
    cg = _flat_candidates(c, at, shape)
    flat_terms = {k: {name: pick(x) for name, x in t.items()} for k, t in terms.items()}
    mm = np.rint(pick(m)).astype(np.int64)
    steps, work = np.zeros(at.size), np.zeros(at.size)
    for (code, p, v), sel in pipeline._groups([cg.pipeline_schedule, cg.pp, cg.vpp]):
        F, I, W = stage_times({k: {n: x[sel] for n, x in t.items()} for k, t in flat_terms.items()},
                              cg.take(sel), num_layers, p, v)
        steps[sel], work[sel] = simulated_steps(PIPELINE_SCHEDULES[code], p, v, mm[sel], F, I, W,
                                                np.zeros(sel.size), extend)
        if record is not None:
            record.append((PIPELINE_SCHEDULES[code], p, v, mm[sel], F, I, W, at[sel]))
    out = [np.array(np.broadcast_to(x, shape), dtype=np.float64) for x in (*closed, 1.0)]
    full_sim = np.broadcast_to(sim, shape)
    out[0][full_sim], out[1][full_sim] = np.inf, np.inf           # what is not simulated below
    with np.errstate(invalid="ignore"):              # inf - inf: a refused layout, masked later
        out[0][index], out[1][index] = steps, steps - work
        out[3][index] = work / np.maximum(mm * pick(slowest), 1e-30)
    return tuple(out)
