"""Memory and compute time of every pipeline rank of one layout, the binding rank, the imbalance.

``evaluate`` keeps per candidate only the first, one middle and the last rank (Estimate.stages);
``plan3d estimate`` shows every pipeline rank: in 1F1B a rank r holds min(pp - r, m)
micro-batches in flight, so memory falls along the pipeline while compute is the same on every
middle rank. This evaluates one layout at all its pp ranks at once (rank index arrays broadcast
against the layout's length-1 arrays; no Python loop over ranks or candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .estimate import Estimate, memory_by_rank


@dataclass(frozen=True)
class StageProfile:
    """Pipeline ranks 0..pp-1 of one layout: per-rank arrays of shape (pp,).

    ``memory`` (bytes per GPU, reserve included), ``activations`` (bytes), ``time`` (seconds of
    forward + backward of one micro-batch on the rank); ``kind`` (first | middle | last);
    ``binding``: the rank with the most memory (the one that decides the fit; the first of
    equals); ``slowest``: the rank with the longest micro-batch time; ``imbalance``: slowest
    rank's time over the mean over ranks (1.0 = balanced)."""

    memory: np.ndarray
    activations: np.ndarray
    time: np.ndarray
    kind: list[str]
    binding: int
    slowest: int
    imbalance: float

    def to_list(self) -> list[dict]:
        """One dict per rank: rank, kind, memory_total, activations, microbatch_time (SI)."""
        return [{"rank": r, "kind": self.kind[r], "memory_total": float(self.memory[r]),
                 "activations": float(self.activations[r]), "microbatch_time": float(self.time[r])}
                for r in range(len(self.kind))]


def rank_kind(rank: int, pp: int) -> str:
    """first (rank 0; with pp = 1 the one rank), last (pp - 1) or middle."""
    return "first" if rank == 0 else ("last" if rank == pp - 1 else "middle")


def stage_profile(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                  est: Estimate, i: int = 0) -> StageProfile:
    """Every pipeline rank of candidate ``i`` of ``est`` (an evaluated, non-summary Estimate).

    Memory per rank as memory_by_rank composes it (model states of the rank's parameters,
    its in-flight activations, transient buffers, reserve); time per rank from the Estimate's
    per-kind micro-batch times (ranks of one kind hold the same layers)."""
    c = est.candidates.take(np.array([i]))
    pp = int(c.pp[0])
    ranks = np.arange(pp)
    terms = memory_by_rank(model, hw, training, c, ranks={"rank": ranks})["rank"]
    total, act = terms["total"], terms["activations"]
    kinds = [rank_kind(r, pp) for r in range(pp)]
    per_kind = {k: float(v["microbatch_time"][i]) for k, v in est.stages.items()}
    time = np.array([per_kind[k] for k in kinds])
    total = np.broadcast_to(total, (pp,)).astype(np.float64)
    return StageProfile(memory=total, activations=np.broadcast_to(act, (pp,)).astype(np.float64),
                        time=time, kind=kinds, binding=int(np.argmax(total)),
                        slowest=int(np.argmax(time)), imbalance=float(time.max() / time.mean()))
