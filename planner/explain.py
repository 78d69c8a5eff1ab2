"""Explanations as data (formatted by planner.render): breakdowns, term-by-term gaps, and what
the explanation under the search table says, as dataclasses.

A step time is the sum of TIME_TERMS (planner.cost.step), so the gap between two layouts is
exactly the sum of their per-term differences; the same holds for memory and MEMORY_TERMS.

Ties: layouts of the ranked list that predict the same step time and the same peak memory per
GPU (equal to a relative 1e-12, i.e. up to rounding) are one ``TieGroup``; the table shows one
row per group, numbered in rank order of each group's best member.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import Estimate
from .cost.checkpoint import evaluate_checkpoint, unavailable
from .cost.model_counts import window_layer_mask
from .cost.stages import stage_profile
from .cost.blocks import rank_blocks
from .cost.compute import block_times
from .cost.precision import blackwell, is_fp8, quantize_bytes
from .cost.step import MEMORY_TERMS, TIME_TERMS, estimate_layout
from .cost.step import evaluate as cost_evaluate
from .layout import Layout
from .explain_bands import BandSummary, TieSummary, band_summary, estimate_band, tie_summary

TIE_RTOL = 1e-12  # "the same prediction": equal up to floating-point rounding
OVERHEAD_FLOOR = 0.001  # below this share of the step no overhead is named
RUNNER_UP_TIE = 1e-4  # a runner-up within this fraction of the step ties on time


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


@dataclass(frozen=True)
class TieGroup:
    """Ranked layouts (indices into the ranked Estimate, best first) with the same predicted
    step time and peak memory. ``varying``: the Layout fields whose values differ among them
    (empty for a group of one)."""

    members: tuple[int, ...]
    varying: tuple[str, ...] = ()

    @property
    def first(self) -> int:
        """The member shown for the group: the best ranked."""
        return self.members[0]

    @property
    def count(self) -> int:
        return len(self.members)


def tie_groups(est: Estimate) -> list[TieGroup]:
    """Every ranked layout in exactly one group, groups in rank order of their first member.

    Two layouts tie when step time and total memory agree to TIE_RTOL (relative). Raises
    nothing; an empty Estimate gives [].
    """
    step = np.asarray(est.time["step"], dtype=np.float64)
    mem = np.asarray(est.memory["total"], dtype=np.float64)
    same = (np.isclose(step[:, None], step[None, :], rtol=TIE_RTOL, atol=0.0)
            & np.isclose(mem[:, None], mem[None, :], rtol=TIE_RTOL, atol=0.0))
    leader = same.argmax(axis=1)  # each layout's best-ranked equal (itself if none better)
    groups = []
    for first in np.unique(leader):
        members = tuple(int(i) for i in np.flatnonzero(leader == first))
        groups.append(TieGroup(members, _varying(est, members)))
    return sorted(groups, key=lambda g: g.first)


def _varying(est: Estimate, members: tuple[int, ...]) -> tuple[str, ...]:
    if len(members) < 2:
        return ()
    layouts = [est.candidates.layout(i).model_dump() for i in members]
    return tuple(k for k in layouts[0] if len({lay[k] for lay in layouts}) > 1)


def tie_dict(est: Estimate, group: TieGroup) -> dict:
    """``ties`` of a search --json entry: how many layouts the entry stands for (``count``, 1 =
    none besides it), the ``varying`` Layout fields, and the other members' ``layouts``."""
    return {"count": group.count, "varying": list(group.varying),
            "layouts": [est.candidates.layout(i).model_dump() for i in group.members[1:]]}


@dataclass(frozen=True)
class Overhead:
    """One step-time term other than compute: seconds and share of the step (fraction)."""

    term: str
    seconds: float
    share: float


@dataclass(frozen=True)
class WinnerSummary:
    """The winner's step (seconds), the compute share of it, and its largest overhead (None
    when every overhead is under OVERHEAD_FLOOR of the step)."""

    layout: Layout
    step_s: float
    compute_share: float
    largest: Overhead | None


@dataclass(frozen=True)
class RunnerUp:
    """The best layout outside the winner's tie group: its table row (1-based), the Layout
    fields that differ from the winner (field, winner's value, its value), whether it ties on
    time (within RUNNER_UP_TIE), its extra memory (bytes, may be negative), how much slower it
    is (fraction of the winner's step), the terms that make it slower ([(term, seconds)],
    positive, largest first) and those that make it faster (negative, largest saving first):
    together they sum to the gap (terms equal to float round-off left out)."""

    row: int
    layout: Layout
    differs: tuple[tuple[str, object, object], ...]
    ties_on_time: bool
    extra_memory: float
    slower_by: float
    worse: tuple[tuple[str, float], ...]
    better: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class CpFallback:
    """When the winner uses context parallelism (``cp`` > 1): the best kept layout without it
    (``row`` in the table, 1-based; None when none is kept) and how many fewer tokens/s it runs
    (fraction of the winner's)."""

    cp: int
    row: int | None = None
    layout: Layout | None = None
    fewer_tokens: float = 0.0


@dataclass(frozen=True)
class Pruning:
    """The search's counts: layouts enumerated and fitting, pruned per rule (in the order
    applied), the usable bytes per GPU and the capacity (they differ with a headroom)."""

    enumerated: int
    fitting: int
    pruned: dict[str, int]
    usable: float
    capacity: float


@dataclass(frozen=True)
class SearchExplanation:
    """What the explanation under the search table says, as data."""

    winner: WinnerSummary
    groups: list[TieGroup]
    runner_up: RunnerUp | None
    cp_fallback: CpFallback | None
    pruning: Pruning
    bands: BandSummary | None = None
    tie: TieSummary | None = None


def explain_search(result, model=None, hw=None, training=None) -> SearchExplanation:
    """The explanation of a planner.search.SearchResult (at least one ranked layout); with the
    job (``model``, ``hw``, ``training``) also its bands and its top tie group."""
    est = result.ranked
    groups = tie_groups(est)
    bands = None if model is None else band_summary(result, model, hw, training)
    return SearchExplanation(winner=_winner(est), groups=groups,
                             runner_up=_runner_up(est, groups),
                             cp_fallback=_cp_fallback(est, groups, result.features),
                             pruning=Pruning(result.enumerated, result.fitting, dict(result.pruned),
                                             float(result.usable), float(est.memory["capacity"][0])),
                             bands=bands, tie=None if model is None else tie_summary(result, groups))


def _winner(est: Estimate) -> WinnerSummary:
    step = float(est.time["step"][0])
    terms = dict(time_breakdown(est, 0))
    big = max((t for t in TIME_TERMS if t != "compute"), key=terms.__getitem__)
    largest = Overhead(big, terms[big], terms[big] / step) \
        if terms[big] >= OVERHEAD_FLOOR * step else None
    return WinnerSummary(est.candidates.layout(0), step, terms["compute"] / step, largest)


def _runner_up(est: Estimate, groups: list[TieGroup]) -> RunnerUp | None:
    if len(groups) < 2:
        return None
    j = groups[1].first
    first, second = est.candidates.layout(0), est.candidates.layout(j)
    differs = tuple((k, getattr(first, k), getattr(second, k)) for k in type(first).model_fields
                    if getattr(first, k) != getattr(second, k))
    step = est.time["step"]
    deltas = term_deltas(est, j, est, 0)
    noise = 1e-9 * float(step[0])  # float round-off of equal terms, not a difference
    worse = tuple((t, d) for t, d in deltas if d > noise)
    better = tuple((t, d) for t, d in reversed(deltas) if d < -noise)
    return RunnerUp(row=2, layout=second, differs=differs,
                    ties_on_time=bool(step[j] <= step[0] * (1 + RUNNER_UP_TIE)),
                    extra_memory=float(est.memory["total"][j] - est.memory["total"][0]),
                    slower_by=float(step[j] / step[0] - 1), worse=worse, better=better)


def _cp_fallback(est: Estimate, groups: list[TieGroup], features=None) -> CpFallback | None:
    """The best kept layout without CP when the winner's CP is a term no measured run checked
    (search.bands; with no ``features``, whenever the winner uses CP)."""
    cp = est.candidates.cp
    if int(cp[0]) <= 1:
        return None
    if features is not None and not any(bool(features.unchecked[k][0]) for k in
                                        ("cp_ring_nvlink", "cp_ring_network") if k in features.unchecked):
        return None
    no_cp = np.flatnonzero(cp == 1)
    if no_cp.size == 0:
        return CpFallback(int(cp[0]))
    i = int(no_cp[0])
    row = next(n for n, g in enumerate(groups, start=1) if i in g.members)
    tps = est.throughput["tokens_per_s"]
    return CpFallback(int(cp[0]), row, est.candidates.layout(i), float(1 - tps[i] / tps[0]))


@dataclass(frozen=True)
class PrecisionLoss:
    """An FP8 recipe predicted slower than BF16 on the same layout: the ``precision``, the step
    in it and in BF16 (seconds), and what makes the difference: ``terms`` [(what, seconds,
    note)], FP8 minus BF16, largest first by size; compute split into the linear GEMMs (at the
    FP8 peak) and the memory-bound quantize / cast kernels (compute.block_times: their shares
    of the compute change on the first pipeline rank); they sum to the step's change."""

    precision: str
    step: float
    bf16_step: float
    terms: tuple[tuple[str, float, str], ...]


def precision_loss(model, hw, training, est, i: int = 0) -> PrecisionLoss | None:
    """Why layout i of ``est`` (a full Estimate in ``training``'s precision) is slower in FP8
    than in BF16, or None when it is not (or the training is BF16)."""
    if not is_fp8(training):
        return None
    c = est.candidates.take(np.array([i]))
    bf16 = training.model_copy(update={"precision": "bf16"})
    other = cost_evaluate(model, hw, bf16, c)
    step8, step16 = float(est.time["step"][i]), float(other.time["step"][0])
    if step8 <= step16:
        return None
    blocks = rank_blocks(model, c, 0)
    t8, t16 = block_times(model, training, hw, c), block_times(model, bf16, hw, c)
    gemm = sum(float(blocks[k][0]) * 3.0 * float(np.ravel(t8[k].gemm_forward - t16[k].gemm_forward)[0])
               for k in t8 if k in blocks)
    cast = sum(float(blocks[k][0]) * 3.0 * float(np.ravel(t8[k].memory_forward - t16[k].memory_forward)[0])
               for k in t8 if k in blocks)
    d_compute = float(est.time["compute"][i] - other.time["compute"][0])
    scale = d_compute / (gemm + cast) if abs(gemm + cast) > 1e-30 else 0.0
    per = f"{quantize_bytes(hw, training):g} B of HBM traffic per element of each linear input and output gradient"
    terms = [("linear GEMMs at the FP8 peak", gemm * scale, f"{training.precision} tensor cores"),
             ("FP8 quantize and cast kernels (amax, scale, cast" +
              (", transpose" if training.precision == "fp8" and not blackwell(hw) else "") + ")",
             cast * scale, per)]
    notes = {"host": "kernel launches per linear layer", "optimizer": "FP8 weight copies once per step",
             "recompute": "recomputed casts and GEMMs", "tp_comm": "FP8 all-gathers of linear inputs",
             "dp_comm": "FP8 parameter all-gather"}
    for t in TIME_TERMS:
        if t == "compute":
            continue
        d = float(est.time[t][i] - other.time[t][0])
        if abs(d) > 1e-6 * step8:
            terms.append((t, d, notes.get(t, "")))
    terms.sort(key=lambda x: -abs(x[1]))
    return PrecisionLoss(training.precision, step8, step16, tuple(terms))


def model_notes(model) -> list[str]:
    """What a reader of a search or an export should know about ``model``'s architecture, one
    sentence each: the sliding window (which layers; the per-GPU attention time counts full
    causal attention, model FLOPs the window: cost.support), biases (all linear layers, or Q/K/V
    only), QK norms, attention sinks, the norm epsilon when unknown, then the model's own
    ``notes`` (provenance, what the counts leave out, defaults taken on import)."""
    out = []
    if model.sliding_window is not None:
        n = int(window_layer_mask(model).sum())
        out.append(f"sliding window of {model.sliding_window} tokens on {n} of {model.num_layers} "
                   f"layers ({model.window_layers or 'all'}); per-GPU attention time counts full "
                   "causal attention, model FLOPs (MFU) the window")
    if model.bias:
        out.append("biases on every linear layer" + (" (experts and router too)" if model.moe else ""))
    elif model.qkv_bias:
        out.append("biases on the Q/K/V projections only (qkv_bias)")
    if model.qk_norm != "none":
        what = "each head's" if model.qk_norm == "per_head" else "the whole"
        out.append(f"queries and keys are normalised after the QKV projection ({what} q and k; "
                   f"qk_norm: {model.qk_norm}); the norms' inputs are saved activations")
    if model.attention_sinks:
        out.append("a learned attention sink per head")
    if model.norm_epsilon is None:
        out.append("norm epsilon not known (norm_epsilon): exports leave the framework's default")
    if model.notes:
        out.append(" ".join(model.notes.split()))
    return [f"{model.name}: {n}" for n in out]


def schedule_note(model, hw, training, est: Estimate, i: int = 0) -> str | None:
    """One sentence where layout ``i`` of ``est`` runs a pipeline schedule beyond the one its vpp
    implies (1F1B, interleaved 1F1B; layout.axes): which, and its step and memory against the
    implied schedule's on the same layout (evaluated here: cost.step.estimate_layout), or that
    the implied one does not fit. None otherwise."""
    lay = est.candidates.layout(i)
    implied = "interleaved-1f1b" if lay.vpp > 1 else "1f1b"
    if lay.pp == 1 or lay.pipeline_schedule == implied:
        return None
    twin = estimate_layout(model, hw, training, lay.model_copy(update={"pipeline_schedule": implied}))
    step, other = float(est.time["step"][i]), float(twin.time["step"][0])
    memory = float(est.memory["total"][i] - twin.memory["total"][0]) / 2**30
    text = f"the pipeline schedule {lay.pipeline_schedule} (not {implied}, which vpp={lay.vpp} implies)"
    if not bool(twin.fits[0]):
        return f"{text}: {implied} does not fit on this layout ({memory:+.1f} GiB beside it)"
    faster = other - step
    return (f"{text}: the step is {abs(faster) * 1e3:.1f} ms ({abs(faster) / other:.2%}) "
            f"{'shorter' if faster >= 0 else 'longer'} than with {implied}, memory "
            f"{memory:+.1f} GiB")


def recompute_choice(model, est: Estimate, i: int = 0) -> dict:
    """Which recomputation layout ``i`` runs, as data for estimate's output and ``--json``:
    ``mode`` (none | selective | selective+ | full), ``method`` (Megatron's: ``uniform`` = every
    layer, ``block`` = the first ``num_layers`` of each model chunk; None unless full),
    ``num_layers`` (0 = every layer), ``chunk_layers`` (a first-stage model chunk's layers),
    ``recomputed_layers`` (layers recomputed in full per micro-batch over all pipeline ranks,
    LayoutDegrees.recomputed_layers), ``seconds`` (the step's recompute term) and ``share`` of
    the step. Seconds are None for a summary-less estimate."""
    c = est.candidates.take(np.array([i]))
    lay = c.layout(0)
    full = lay.recompute == "full"
    chunk = float(c.rank_chunk_layers(model.num_layers, 0)[0][0])
    seconds = est.time.get("recompute")
    step = est.time.get("step")
    return {"mode": lay.recompute,
            "method": None if not full else ("block" if lay.recompute_num_layers else "uniform"),
            "num_layers": lay.recompute_num_layers, "chunk_layers": chunk,
            "recomputed_layers": float(c.recomputed_layers(model.num_layers)[0]),
            "seconds": None if seconds is None else float(seconds[i]),
            "share": None if seconds is None or step is None else float(seconds[i] / step[i])}


@dataclass
class EstimateReport:
    """Everything ``estimate`` reports on one layout: its ``estimate`` (one candidate), the
    pipeline ranks (cost.stages.StageProfile), the recomputation chosen (recompute_choice),
    the checkpoint estimate (None when it does not fit or the hardware has no storage block),
    its error ``band`` (estimate_band) and, when it does not fit, ``to_fit`` (search.refusal.FitHint: the best layout that fits
    on these GPUs, else the fewest GPUs on which one fits; None when no count fits)."""

    estimate: Estimate
    stages: object
    recompute: dict
    checkpoint: object = None
    to_fit: object = None
    band: dict | None = None

    @property
    def fits(self) -> bool:
        return bool(self.estimate.fits[0])


def estimate_report(model, hw, training, layout: Layout, to_fit) -> EstimateReport:
    """The EstimateReport of ``layout``; ``to_fit``: a callable giving the FitHint when it does
    not fit (search.run.to_fit, bound to the model, hardware, training and GPUs)."""
    est = estimate_layout(model, hw, training, layout)
    fits = bool(est.fits[0])
    ck = None if unavailable(hw) or not fits else evaluate_checkpoint(
        model, hw, training, est.candidates, est.time["step"])
    return EstimateReport(est, stage_profile(model, hw, training, est), recompute_choice(model, est, 0),
                          ck, None if fits else to_fit(), estimate_band(model, hw, training, est, 0))
