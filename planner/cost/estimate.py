"""The Estimate of N layouts, and memory per GPU composed per pipeline rank (formulas.md 2-3).

``Estimate`` holds arrays of shape (N,) (or broadcast over a search grid): memory by kind on
the peak rank and per rank kind, time by term with the link time per process group, and
throughput. ``memory_by_rank`` composes model states, activations and buffers per rank;
``memory_total`` is what the search's fit test reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .context_parallel import ring_buffer_bytes
from . import memory
from .memory import RANK_KINDS, activation_bytes_by_stage, model_state_bytes
from .blocks import block_kinds

MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other", "reserve")
TIME_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "offload",
              "host", "bubble", "optimizer")
LINK_GROUPS = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True)
class Estimate:
    """Predictions for N candidates, each value an (N,) array (broadcast over a search grid).

    memory (bytes, the pipeline rank with the highest peak): weights, gradients, optimizer,
    activations, other (transient buffers), reserve (runtime + allocator, reserve_bytes),
    total, capacity, peak_stage (0 first,
    1 middle, pp-1 last); ``fits`` (bool). ``stages``: {first|middle|last: {total, activations,
    time}}: memory per rank kind and the forward+backward seconds of one micro-batch on it.
    time (seconds): step and its terms (sum of TIME_TERMS == step), plus bubble_fraction: the
    bubble over the busiest stage's work in the step (m x its per-micro-batch compute,
    recomputation and exposed communication), Narayanan's (pp-1)/(vpp*m) for equal stages, which
    exceeds 1 when there are fewer micro-batches than stages (``bubble_share``: the bubble as a
    share of the step, at most 1, what tables print beside the step).
    ``link`` (seconds per step on the busiest stage): time the collectives of each group
    (tp, cp, ep with expert-TP, pp, dp with edp) spend on their links, overlapped or not; time[X_comm] is what is exposed.
    throughput: tokens_per_s, model_tflops_per_gpu, mfu, hfu (fractions of the dense peak).
    """

    candidates: object
    memory: dict[str, np.ndarray]
    time: dict[str, np.ndarray]
    throughput: dict[str, np.ndarray]
    link: dict[str, np.ndarray] = field(default_factory=dict)
    stages: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def fits(self) -> np.ndarray:
        """Which layouts fit in HBM, (N,) bool. ValueError for a summary estimate (evaluate's
        ``summary=True`` computes no memory: use memory_total)."""
        if "total" not in self.memory:
            raise ValueError("a summary estimate has no memory; use cost.memory_total")
        return self.memory["total"] <= self.memory["capacity"]

    def bubble_share(self) -> np.ndarray:
        """The pipeline bubble as a share of the step time, (N,) in [0, 1]: the bubble is one of
        the step's terms, so it is at most the whole step (bubble_fraction, over the busiest
        stage's work alone, reaches (pp-1)/m: 4.4 for 7 micro-batches on 32 stages)."""
        return self.time["bubble"] / np.maximum(self.time["step"], 1e-30)

    def take(self, index: np.ndarray) -> "Estimate":
        def sub(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: v[index] for k, v in d.items()}
        return Estimate(self.candidates.take(index), sub(self.memory), sub(self.time),
                        sub(self.throughput), sub(self.link),
                        {k: sub(v) for k, v in self.stages.items()})

    def to_dict(self, i: int, usable: float | None = None, raw: bool = False) -> dict:
        """Candidate i as the JSON object of ``plan3d estimate --json`` (SI units).

        ``memory.fits``: total <= ``usable`` bytes (default: the capacity); ``memory.shortfall_bytes``:
        how far over that it is per GPU (0 when it fits). A layout that does not fit cannot run,
        so its time, link, throughput and per-stage micro-batch times are None (the keys stay).
        ``raw``: every computed term whether it fits or not, and no shortfall (the terms the
        regress baseline records)."""
        mem = {k: float(v[i]) for k, v in self.memory.items()}
        mem["peak_stage"] = int(mem["peak_stage"])
        limit = mem["capacity"] if usable is None else float(usable)
        fits = bool(self.fits[i]) if usable is None else mem["total"] <= limit
        mem["fits"] = fits
        if not raw:
            mem["shortfall_bytes"] = max(mem["total"] - limit, 0.0)
        ran = fits or raw
        value = (lambda v: float(v[i])) if ran else (lambda v: None)
        out = {"layout": self.candidates.layout(i).model_dump(), "memory": mem,
               "time": {k: value(v) for k, v in self.time.items()},
               "throughput": {k: value(v) for k, v in self.throughput.items()}}
        if not raw:  # derived from two recorded terms: not a regression term of its own
            out["time"]["bubble_share"] = value(self.bubble_share())
        if self.link:
            out["time"]["link"] = {k: value(v) for k, v in self.link.items()}
        if self.stages:
            out["stages"] = [{"stage": kind, **{k: float(v[i]) if ran or k != "microbatch_time"
                                                else None for k, v in terms.items()}}
                             for kind, terms in self.stages.items()]
        return out


def rank_kinds(c, model: ModelSpec | None = None) -> tuple[str, ...]:
    """The rank kinds whose memory can differ: first and last, and the middle one (rank 1)
    where some split is uneven (its ranks can then hold more layers than the edges) or, given
    ``model``, where its layers differ by rank (MoE every few layers, windowed attention, MTP):
    then rank 1 can hold more than either edge on an even split too (Llama 4 Maverick, MoE
    every other layer, 3 layers per rank on pp 16: one MoE layer on rank 0, two on rank 1)."""
    if model is not None and (block_kinds(model) != ("attention", "mlp") or model.mtp_layers):
        return RANK_KINDS
    return RANK_KINDS if np.any(c.uneven()) else ("first", "last")


def memory_by_rank(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                   kinds: tuple[str, ...] = ("first", "last"),
                   ranks: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """{rank kind: {weights, gradients, optimizer, activations, other, reserve, total}} per GPU, bytes.
    (``ranks``: {label: pipeline rank index array} instead of ``kinds``, e.g. every rank of one
    layout {"rank": np.arange(pp)}, broadcast against ``c``: cost.stages.)

    Model states of the rank's parameters (memory.model_state_bytes), its peak activations
    (memory.activation_bytes_by_stage), "other": transient buffers (SP gather, ZeRO-3 units,
    the CP ring's receive buffers), and "reserve" (reserve_bytes: what the runtime and the
    allocator keep beyond the tensors). States and buffers are added on their smaller
    broadcast shapes before the activations."""
    other = memory.transient_bytes(model, training, c) + ring_buffer_bytes(model, training, c)
    targets = ranks if ranks is not None else {k: memory.rank_index(c, k) for k in kinds}
    activations = activation_bytes_by_stage(model, training, c, ranks=targets)
    out = {}
    for kind, rank in targets.items():
        terms = rank_states(model, hw, training, c, rank)
        terms["activations"] = activations[kind]
        terms["other"] = other
        terms["reserve"] = reserve_bytes(hw, training, c, activations[kind] + other)
        terms["total"] = (terms["weights"] + terms["gradients"] + terms["optimizer"] + other) \
            + terms["activations"] + terms["reserve"]
        out[kind] = terms
    return out


def rank_states(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                rank) -> dict[str, np.ndarray]:
    """{weights, gradients, optimizer} bytes on one GPU of pipeline rank ``rank``: the model
    states (memory.model_state_bytes) of its dense parameters (blocks, embedding, head) and its
    expert parameters (memory.rank_params), the blocks' and experts' linear weights at the FP8
    recipe's bytes where the precision is FP8. Broadcast arrays of the split and ZeRO fields."""
    p = memory.rank_params(model, c, rank)
    return model_state_bytes(memory.non_expert_params(p), c, training, p["experts"],
                             linear=p["dense"], hw=hw)


def states_floor(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> np.ndarray:
    """A lower bound of memory_total from the model states alone, on their small shapes (split
    rows x ZeRO stage x distributed optimizer), bytes: the first and last rank's weights +
    gradients + optimizer states, summed as memory_by_rank sums them, plus least_reserve.
    memory_by_rank adds buffers, activations and the rest of the reserve to the same sum, none
    of them negative, and rounding is monotone: a layout whose floor exceeds the usable memory
    does not fit (the search drops it before computing its activations)."""
    floors = []
    for kind in ("first", "last"):
        terms = rank_states(model, hw, training, c, memory.rank_index(c, kind))
        floors.append(terms["weights"] + terms["gradients"] + terms["optimizer"] + least_reserve(hw, training))
    return np.maximum(*floors)


def reserve_bytes(hw: HardwareProfile, training: TrainingSpec, c, working_set) -> np.ndarray:
    """Memory per GPU the runtime and the allocator keep beyond the tensors (formulas.md 3.10),
    bytes: the framework profile's ``reserve_runtime`` (CUDA context, workspaces, HBM the driver
    keeps) + ``reserve_per_communicator`` x LayoutDegrees.communicators + ``reserve_allocator``
    x ``working_set`` (activations and transient buffers: what the caching allocator allocates
    and frees every step), plus the hardware profile's optional ``framework_overhead`` (an
    extra allowance a site sets; none in the shipped profiles). Broadcast array."""
    return (least_reserve(hw, training) + training.reserve_per_communicator * c.communicators) \
        + training.reserve_allocator * working_set


def least_reserve(hw: HardwareProfile, training: TrainingSpec) -> float:
    """The reserve every layout keeps at least, bytes: reserve_bytes without communicators or
    working set (the framework's runtime part and the hardware profile's optional extra)."""
    return float(training.reserve_runtime) + float(hw.framework_overhead or 0.0)


def memory_total(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> np.ndarray:
    """Per-GPU peak memory in bytes of the most loaded pipeline rank (the ``memory["total"]`` of
    evaluate, without the step time); the search's fit test. Broadcast array."""
    per_rank = memory_by_rank(model, hw, training, c, rank_kinds(c, model))
    return np.maximum.reduce([terms["total"] for terms in per_rank.values()])


def peak_memory(per_rank: dict[str, dict[str, np.ndarray]], c,
                capacity: float) -> dict[str, np.ndarray]:
    """The memory terms of the rank kind with the highest total (first wins ties, then last,
    then middle), with ``capacity`` and ``peak_stage`` (that rank's index). Bytes."""
    first, last = per_rank["first"], per_rank["last"]
    use_last = last["total"] > first["total"]
    mem = {k: np.where(use_last, last[k], first[k]) for k in (*MEMORY_TERMS, "total")}
    peak = np.where(use_last, np.asarray(c.pp) - 1, 0)
    if "middle" in per_rank:
        middle = per_rank["middle"]
        use_middle = middle["total"] > mem["total"]
        mem = {k: np.where(use_middle, middle[k], mem[k]) for k in mem}
        peak = np.where(use_middle, 1, peak)
    mem["capacity"] = np.full(np.shape(mem["total"]), float(capacity))
    mem["peak_stage"] = np.broadcast_to(peak, np.shape(mem["total"])).astype(np.float64)
    return mem
