"""Ties by the error band, and the pick inside the top tie group by stated preferences.

plan3d's step times are estimates: two layouts of one job whose predictions differ by less than
plan3d's own error on such differences (search.bands: the tie band, from measured pairs of runs
of one job, plus each layout's unchecked terms) are a tie, not a win. The layouts that tie with
the best-scoring one form the top tie group; inside it the pick follows these preferences, in
order, each overridable:

1. **headroom**: leaves at least ``min_free`` of the GPU's HBM free (--min-free; default the
   memory band's share, bands.Bands.min_free): plan3d's memory model errs by that much;
2. **checked**: fewer cost terms that no measured run exercised (bands.unchecked: CP ring
   exposure at fewer tokens per CP rank than measured, activation offload, ...);
3. **conventional**: fewer departures from the layouts the best teams run (UNCONVENTIONAL: TP and
   EP groups inside the NVLink domain, no CP at sequences shorter than any measured CP run,
   ZeRO-1 / the distributed optimizer rather than ZeRO-2/3 where the framework offers it), then
   fewer pipeline stages;
4. the score (the objective), then the exact-tie rule of a strict ranking (no offload, the
   lower ZeRO stage, less memory).

With ``strict_rank`` (--strict-rank) the order is the objective's alone, as before ties.
Everything works on the kept pool as flat arrays (no loop over layouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.offload import uses_host_memory
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import bands as B
from .framework_rules import profile_for

UNCONVENTIONAL = {
    "tp_network": "TP across NVLink domains",
    "ep_network": "EP across NVLink domains",
    "cp_short": "CP at a sequence shorter than any measured CP run",
    "zero_sharded": "ZeRO-2/3 where ZeRO-1 (the distributed optimizer) runs",
}
PREFERENCES = ("headroom", "checked", "conventional", "fewer pipeline stages", "speed")


def cp_min_sequence(bands: B.Bands) -> float:
    """The least sequence length of a measured run with CP (inf when none)."""
    seqs = [bands.checked.get(t, {}).get("seq") for t in ("cp_ring_nvlink", "cp_ring_network")]
    seqs = [float(s) for s in seqs if s is not None]
    return min(seqs) if seqs else float("inf")


def unconventional(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                   bands: B.Bands, framework=None) -> dict[str, np.ndarray]:
    """{mark: where candidates ``c`` depart from the convention} (UNCONVENTIONAL). Bool arrays."""
    uses = B.term_uses(model, hw, training, c)
    stages = profile_for(training, framework).rules.zero_stages
    zero = np.asarray(c.zero_stage)
    return {"tp_network": uses["tp_network"], "ep_network": uses["ep_network"],
            "cp_short": (np.asarray(c.cp) > 1) & (training.seq_length < cp_min_sequence(bands)),
            "zero_sharded": (zero >= 2) & (1 in stages)}


def preferred(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c, bands: B.Bands,
              framework=None) -> np.ndarray:
    """Where candidates ``c`` use no unchecked term and nothing unconventional (the scan keeps
    the best of these beside the best of all, so the pick can find them). Bool array."""
    ok = np.bool_(True)
    for mask in B.unchecked(model, hw, training, c, bands).values():
        ok = ok & ~mask
    for mask in unconventional(model, hw, training, c, bands, framework).values():
        ok = ok & ~np.asarray(mask)
    return ok


@dataclass(frozen=True)
class Prefer:
    """What the scan needs to keep the best preferred layouts beside the best of all: the bytes
    per GPU a roomy layout stays within (capacity x (1 - min_free)), the bands, the framework
    profile whose rules apply (None: the training's)."""

    roomy_bytes: float
    bands: B.Bands
    framework: object = None


@dataclass(frozen=True)
class Features:
    """What the preferences read of N evaluated layouts, (N,) arrays: ``free`` share of HBM,
    ``roomy`` (free >= min_free), the unchecked terms ({term: mask}) and their count, the
    unconventional marks ({mark: mask}) and their count, ``pp``, the band's widening below and
    above (shares of the step, bands.widening)."""

    free: np.ndarray
    roomy: np.ndarray
    unchecked: dict
    n_unchecked: np.ndarray
    marks: dict
    n_marks: np.ndarray
    pp: np.ndarray
    below: np.ndarray
    above: np.ndarray

    def take(self, index) -> "Features":
        sub = lambda d: {k: np.asarray(v)[index] for k, v in d.items()}  # noqa: E731
        return Features(self.free[index], self.roomy[index], sub(self.unchecked),
                        self.n_unchecked[index], sub(self.marks), self.n_marks[index],
                        self.pp[index], self.below[index], self.above[index])


def features(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, est, min_free: float,
             bands: B.Bands, framework=None) -> Features:
    """The Features of the layouts of ``est`` (a full Estimate)."""
    c = est.candidates
    n = len(est)
    free = 1.0 - np.asarray(est.memory["total"], dtype=np.float64) / np.asarray(est.memory["capacity"])
    open_ = {k: np.broadcast_to(v, (n,)).copy() for k, v in B.unchecked(model, hw, training, c, bands).items()}
    marks = {k: np.broadcast_to(v, (n,)).copy()
             for k, v in unconventional(model, hw, training, c, bands, framework).items()}
    below, above = B.widening(est, open_, model, hw, training)
    return Features(free, free >= min_free - 1e-12, open_, B.unchecked_count(open_, (n,)), marks,
                    B.unchecked_count(marks, (n,)), np.asarray(c.pp, dtype=np.int64), below, above)


@dataclass(frozen=True)
class TieOrder:
    """The order of N evaluated layouts: ``order`` (indices, best first: the top tie group by
    preference, then the rest by score), ``group`` (how many of ``order``'s first are the top
    tie group; 1 with a strict ranking or no tie), ``fastest`` (the index of the best score),
    ``tie`` (the tie band, a log ratio), the layouts' Features, and ``reference`` (the index
    of the layout the group formed around: the best roomy one, else the fastest)."""

    order: np.ndarray
    group: int
    fastest: int
    tie: float
    features: Features | None = None
    min_free: float = 0.0
    strict: bool = False
    deciding: tuple = field(default_factory=tuple)
    reference: int = -1


def gaps(score: np.ndarray, best: int) -> np.ndarray:
    """|ln(score / best score)| of each layout (the objective's ratio: tokens/s, or time to
    train / cost, whose scores are negative); inf where a score is not finite."""
    score = np.asarray(score, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.abs(np.log(np.abs(score) / abs(score[best])))
    return np.where(np.isfinite(score), out, np.inf)


def tie_order(est, score: np.ndarray, index: np.ndarray, feats: Features | None, tie: float,
              min_free: float, strict: bool) -> TieOrder:
    """The TieOrder of the evaluated layouts ``est`` with scores ``score`` (higher is better)
    and grid indices ``index`` (the last tie-break: the order does not depend on the scan's
    path). Exact ties of a strict ranking go to no offload, the lower ZeRO stage, less memory;
    without ``strict``, the layouts whose score is within the tie band of the reference (the
    best roomy layout, else the best) are the top group, ordered by the preferences:
    ln(reference / score) <= tie + ln(1 + the slower one's widening below + the faster one's
    widening above), i.e. their bands overlap; the rest follow by score."""
    c = est.candidates
    mem = np.asarray(est.memory["total"])
    strict_order = np.lexsort((index, mem, c.zero_stage, uses_host_memory(c), -score))
    best = int(strict_order[0])
    if strict:
        return TieOrder(strict_order, 1, best, tie, feats, min_free, True, reference=best)
    # the group forms around the best roomy layout where one is kept: a faster one that leaves
    # less than min_free is within plan3d's memory error of not fitting (it joins the group
    # only where its band overlaps the reference's)
    roomy = strict_order[feats.roomy[strict_order]]
    ref = int(roomy[0]) if roomy.size else best
    gap = gaps(score, ref)
    slower = np.asarray(score) <= score[ref]
    widen = np.where(slower, feats.below + feats.above[ref], feats.above + feats.below[ref])
    member = np.isfinite(score) & (gap <= tie + np.log1p(widen) + 1e-12)
    # headroom first: roomy before not; where none is roomy (an unreachable --min-free), the
    # more free memory first, so asking for more headroom never picks the tightest layout
    headroom = ~feats.roomy if roomy.size else -np.asarray(feats.free)
    key = (index, mem, c.zero_stage, uses_host_memory(c), -score, feats.pp, feats.n_marks,
           feats.n_unchecked, headroom)
    group = np.lexsort(key)
    group = group[member[group]]
    rest = strict_order[~member[strict_order]]
    order = np.concatenate([group, rest])
    return TieOrder(order, int(group.size), best, tie, feats, min_free, False,
                    deciding(feats, int(order[0]), best), ref)


def deciding(feats: Features, pick: int, fastest: int) -> tuple:
    """The preferences that put ``pick`` before the layout of the best score (PREFERENCES
    names: the first where they differ decides; () when the pick is the fastest)."""
    if pick == fastest:
        return ()
    pairs = (("headroom", bool(feats.roomy[pick]) != bool(feats.roomy[fastest])
              or (not feats.roomy[pick] and feats.free[pick] > feats.free[fastest])),
             ("checked", feats.n_unchecked[pick] != feats.n_unchecked[fastest]),
             ("conventional", feats.n_marks[pick] != feats.n_marks[fastest]),
             ("fewer pipeline stages", feats.pp[pick] != feats.pp[fastest]))
    for name, differs in pairs:
        if differs:
            return (name,)
    return ("speed",)
