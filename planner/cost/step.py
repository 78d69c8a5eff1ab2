"""The step time of N layouts, term by term, and the Estimate (formulas.md 7.1).

    T_step = T_pipe(per-micro-batch stage times, bubble) + exposed once-per-step communication
             + optimizer
where one micro-batch on a pipeline rank = its layers x (forward + backward + recompute +
exposed TP and CP) + its edge work (embedding; output layer and loss) + exposed p2p and ZeRO
per-micro-batch traffic. Every collective timed here is one of cost.volumes' (the validator
checks the same list); ``comm`` times them where they sit (collectives.group_span) and applies
what overlaps them. All arrays broadcast over candidates; seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, reduce

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from ..layout import Layout
from . import compute, pipeline, precision, schedules
from . import model_flops as mf
from .collectives import Links
from .blocks import rank_blocks
from .comm import BlockComm, RankComm, a2a_overlap_on, block_comm, rank_comm
from .host import block_host, rank_host_time
from .estimate import (LINK_GROUPS, MEMORY_TERMS, TIME_TERMS, Estimate, memory_by_rank,  # noqa: F401
                       memory_total, peak_memory, rank_kinds)
from .memory import RANK_KINDS, rank_index, zero_divisors
from .traffic import Elements
from ..layout import Candidates
from .memory import non_expert_params, rank_params
from .offload import offload_stall, uses_host_memory


@dataclass(frozen=True)
class LayerCost:
    """Seconds of ONE block for ONE micro-batch on one GPU, by term (broadcast arrays)."""

    compute: np.ndarray  # forward + backward kernels
    recompute: np.ndarray  # full: the forward again with its collectives; selective: attention core
    tp: np.ndarray  # exposed TP/SP communication (forward + backward)
    cp: object  # exposed CP ring communication (forward + backward + recompute)
    ep: object  # exposed expert dispatch and combine (forward + backward)

    @cached_property
    def total(self) -> np.ndarray:
        return self.compute + self.recompute + self.tp + self.cp + self.ep


def block_cost(times: compute.LayerTimes, comm: BlockComm, c) -> LayerCost:
    """A block's terms from its compute times and its exposed communication (comm.block_comm).
    Full recompute runs the block's forward again, with its TP and EP collectives; selective
    recompute (core attention) runs the attention core forward again (torchtitan's per-op
    policy: LayerTimes.selective_recompute, its unsaved matmuls and memory-bound ops); selective+ (layernorm,
    moe_act, mla_up_proj) the block's memory-bound forward (norms, activation functions) and
    MLA's up-projection GEMMs (LayerTimes.light_recompute)."""
    rc = np.asarray(c.recompute)
    selective = times.attention_forward if times.selective_recompute is None else times.selective_recompute
    recompute = np.where(rc == 2, times.forward + comm.tp_recompute + comm.ep_recompute,
                         np.where(rc == 1, selective,
                                  np.where(rc == 3, times.light_recompute, 0.0)))
    return LayerCost(times.forward + times.backward, recompute, comm.tp_exposed, comm.cp_exposed,
                     comm.ep_exposed)


def rank_extra(kind: str, edges: dict, rc: RankComm) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of a rank beyond its layers: edge compute (output layer + loss on
    the last rank), edge TP collectives, blocking p2p, exposed per-micro-batch ZeRO traffic."""
    return {"compute": edges[kind], "tp_comm": rc.edge_tp, "pp_comm": rc.p2p_per_microbatch,
            "dp_comm": rc.dp_per_microbatch}


def _stage_work(costs: dict[str, LayerCost], counts: dict, term: str | None = None, share=None):
    """Per-micro-batch seconds of a rank's blocks: sum over kinds of count x the block's total
    (or one ``term`` of it). ``share``: the share of the rank's layers that recompute
    (LayoutDegrees.recompute_share; None = all of them), which scales the recompute term."""
    if share is None:
        return sum(counts[k] * (costs[k].total if term is None else getattr(costs[k], term)) for k in counts)
    if term == "recompute":
        return sum(counts[k] * share * costs[k].recompute for k in counts)
    if term is None:
        return sum(counts[k] * (costs[k].total - (1.0 - share) * costs[k].recompute) for k in counts)
    return sum(counts[k] * getattr(costs[k], term) for k in counts)


def _stage_times(costs, counts: dict, extra: dict, shares=None) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of each rank kind: its blocks + its extras."""
    return {kind: _stage_work(costs, counts[kind], None, _share(shares, kind)) + sum(extra[kind].values())
            for kind in extra}


def _share(shares, kind: str):
    """The recompute share of rank kind ``kind`` (None: every layer recomputes)."""
    return None if shares is None else shares[kind]


def recompute_shares(model: ModelSpec, c) -> dict[str, np.ndarray] | None:
    """{rank kind: share of its layers that recompute} where some layout recomputes the first
    N layers of each chunk in full (LayoutDegrees.recompute_share), else None."""
    if not np.any(np.asarray(c.recompute_num_layers) > 0):
        return None
    if not np.any(c.uneven()):  # every rank's chunks hold L/(pp*vpp) layers: one share
        share = c.recompute_share(model.num_layers, 0)
        return {kind: share for kind in RANK_KINDS}
    return {kind: c.recompute_share(model.num_layers, rank_index(c, kind)) for kind in RANK_KINDS}


def pipeline_makespan(costs, counts: dict, extra: dict, c, m, uniform: bool, shares=None) -> tuple:
    """(makespan, bubble, stage totals) of the forward and backward passes of one step.

    ``uniform`` (every rank holds the same mix of blocks per layer and the split is even): the
    first and last rank hold a middle rank's blocks plus their extras, and
    pipeline.even_pipeline_time runs on small shapes; otherwise the general schedule
    pipeline.pipeline_time over the ranks' totals (formulas.md 6), for the uneven splits only
    where the search mixes them, so that a layout's numbers do not depend on what else is
    evaluated with it. Each of the two runs only where some layout takes it."""
    general_rows = c.uneven() if uniform else np.ones(np.shape(c.pp), dtype=bool)
    if np.any(general_rows):
        general = _stage_times(costs, counts, extra, shares)
        t_general, bubble_general = pipeline.pipeline_time(general["first"], general["middle"],
                                                           general["last"], c.pp, c.vpp, m)
        if np.all(general_rows):
            return t_general, bubble_general, general
    middle = _stage_work(costs, counts["middle"], None, _share(shares, "middle")) + sum(extra["middle"].values())
    extra_first = sum(extra["first"].values()) - sum(extra["middle"].values())
    extra_last = sum(extra["last"].values()) - sum(extra["middle"].values())
    t_pipe, bubble = pipeline.even_pipeline_time(middle, extra_first, extra_last, c.pp, c.vpp, m)
    totals = {"first": middle + extra_first, "middle": middle, "last": middle + extra_last}
    if np.any(general_rows):
        t_pipe = np.where(general_rows, t_general, t_pipe)
        bubble = np.where(general_rows, bubble_general, bubble)
        totals = {k: np.where(general_rows, general[k], totals[k]) for k in totals}
    return t_pipe, bubble, totals


def scheduled_makespan(model: ModelSpec, c, m, times, costs, counts, extra, shares, totals,
                       t_pipe, bubble, fill, where=None, exact: bool = False,
                       record: list | None = None) -> tuple:
    """(pipeline time, bubble, p2p fill, work scale) with the schedules' beyond 1F1B and
    interleaved 1F1B (cost.schedules.scheduled_makespan; with ``exact`` every schedule's
    simulated) where a candidate runs one (pipeline.simulated), from its
    rank kinds' terms: blocks and recompute as _stage_work sums them, kernels and
    weight-gradient GEMMs from ``times``, extras from ``extra``. ``where`` (bool, broadcast
    against ``c``; None: all): the layouts whose step is wanted, a simulated schedule is
    simulated only there and infinite elsewhere (the search passes its fitting layouts);
    ``exact``: every schedule simulated, the closed forms' uneven stages included (the step a
    timeline draws); ``record``: a list that receives the simulated op times
    (cost.schedules.simulate_steps). Seconds, broadcast arrays."""
    work = {k: (_stage_work(costs, counts[k], None, _share(shares, k)),
                _stage_work(costs, counts[k], "recompute", _share(shares, k))) for k in RANK_KINDS}
    terms = schedules.kind_terms(times, counts, work, extra)
    return schedules.scheduled_makespan(model.num_layers, c, m, terms, totals, t_pipe, bubble,
                                        fill, where, exact, record)


def optimizer_time(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> np.ndarray:
    """The optimizer step on the rank with the most parameters (compute.optimizer_time): its
    optimizer shard is updated, its whole (ZeRO-1) or sharded (ZeRO-2/3) gradient buffer zeroed;
    dense parameters sharded over dp*cp, expert ones over edp (memory.zero_divisors); its linear
    weights (blocks and experts) are what FP8 quantizes once per step."""
    _, grad_div, opt_div = zero_divisors(c)
    _, grad_div_e, opt_div_e = zero_divisors(c, "expert") if model.moe is not None else (1.0, 1.0, 1.0)
    updated, buffer, linear = [], [], []
    for kind in rank_kinds(c, model):
        p = rank_params(model, c, rank_index(c, kind))
        dense = non_expert_params(p)
        updated.append(dense / opt_div + p["experts"] / opt_div_e)
        buffer.append(dense / grad_div + p["experts"] / grad_div_e)
        linear.append(p["dense"] + p["experts"])
    return compute.optimizer_time(np.maximum.reduce(updated), hw, training, np.maximum.reduce(buffer),
                                  np.maximum.reduce(linear))


def evaluate(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
             causal_flops: bool = True, summary: bool = False, where=None,
             exact: bool = False, record: list | None = None) -> Estimate:
    """Evaluate candidate layouts ``c`` (Candidates, (N,) or broadcast); returns an Estimate.

    ``causal_flops`` selects the model-FLOPs convention of MFU (causal attention, as Megatron-LM
    logs it since 2025-03); the compute time always uses what the kernels execute. Raises nothing
    for unfit layouts: ``fits`` says which do. ``summary=True`` (the search's bulk pass) returns
    only time step and tokens_per_s -- the same values -- and skips memory (memory_total) and the
    breakdowns. ``where``, ``exact``, ``record``: the pipeline schedules' options
    (scheduled_makespan: where a step is wanted, every schedule simulated, its op times kept).
    """
    links, elem = Links.of(hw), Elements.of(training)
    m = c.num_microbatches(training.global_batch_size)
    counts = {kind: rank_blocks(model, c, rank_index(c, kind)) for kind in RANK_KINDS}  # blocks per rank
    times = compute.block_times(model, training, hw, c)                  # kernels, per block
    comms = block_comm(model, training, c, links, times, elem, not summary, hw.gpu.sm_count)  # TP, CP, EP per block
    costs = {k: block_cost(times[k], comms[k], c) for k in times}
    output = compute.output_layer_time(model, training, hw, c) * (1 + model.mtp_layers)
    output_gemm = compute.output_gemm_time(model, training, hw, c)
    ranks = {kind: rank_comm(model, training, c, links, times, elem, kind, counts[kind], output_gemm,
                             not summary) for kind in RANK_KINDS}          # edges, p2p, DP
    edges = {kind: np.where(ranks[kind].is_last, output, 0.0) for kind in RANK_KINDS}
    extra = {kind: rank_extra(kind, edges, ranks[kind]) for kind in RANK_KINDS}
    _host_and_offload(model, hw, training, c, costs, times, counts, extra)
    uniform = set(times) == {"attention", "mlp"} and model.mtp_layers == 0
    shares = recompute_shares(model, c)
    t_pipe, bubble, totals = pipeline_makespan(costs, counts, extra, c, m, uniform, shares)
    dp_once = reduce(np.maximum, [ranks[k].dp_step_exposed for k in RANK_KINDS])  # slowest rank
    norm_once = reduce(np.maximum, [ranks[k].norm_exposed for k in RANK_KINDS])
    p2p_fill, scale = ranks["middle"].p2p_fill, 1.0
    if exact or np.any(pipeline.simulated(c)):  # GPipe, looped BFS, zero bubble, V, DualPipe
        t_pipe, bubble, p2p_fill, scale = scheduled_makespan(
            model, c, m, times, costs, counts, extra, shares, totals, t_pipe, bubble, p2p_fill,
            where, exact, record)
    t_opt = optimizer_time(model, hw, training, c)
    step = t_pipe + (p2p_fill + dp_once + norm_once + t_opt)
    tokens = training.global_batch_size * training.seq_length
    if summary:
        return Estimate(c, {}, {"step": step}, {"tokens_per_s": tokens / step})
    slowest = _slowest(totals, c)
    time = {k: v * scale for k, v in _breakdown(slowest, costs, counts, extra, m, shares).items()}
    time["pp_comm"] = time["pp_comm"] + p2p_fill
    time["tp_comm"] = time["tp_comm"] + norm_once
    time["dp_comm"] = time["dp_comm"] + dp_once
    time["bubble"], time["optimizer"], time["step"] = bubble, t_opt, step
    time["bubble_fraction"] = bubble / (m * np.maximum(_pick(slowest, totals) * scale, 1e-30))
    link = {g: _pick(slowest, {k: ranks[k].link_per_step(g, comms, m) for k in RANK_KINDS})
            for g in LINK_GROUPS}
    per_rank = memory_by_rank(model, hw, training, c, RANK_KINDS)
    mem = peak_memory({k: per_rank[k] for k in rank_kinds(c, model)}, c, float(hw.gpu.hbm_capacity))
    stages = {k: {"memory_total": per_rank[k]["total"], "activations": per_rank[k]["activations"],
                  "microbatch_time": totals[k]} for k in RANK_KINDS}
    return Estimate(c, mem, time, _throughput(model, hw, training, c, step, causal_flops), link,
                    stages)


def _host_and_offload(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c, costs: dict,
                      times: dict, counts: dict, extra: dict) -> None:
    """Add each rank kind's exposed host (CPU) time (cost.host) and, where a layout offloads
    activations, the offload stall (cost.offload; pp 1 only: every rank kind is rank 0) to
    ``extra``."""
    overlap = a2a_overlap_on(c) if model.moe is not None else False
    host = block_host(model, hw, training, c, costs)
    for kind in RANK_KINDS:
        extra[kind]["host"] = rank_host_time(model, training, c, host, times, counts[kind], overlap)
    if np.any(uses_host_memory(c)):
        stall = offload_stall(model, hw, training, c, times, counts["first"], rank_index(c, "first"))
        for kind in RANK_KINDS:
            extra[kind]["offload"] = stall


def _slowest(totals: dict, c) -> dict[str, np.ndarray]:
    """Masks of the slowest rank kind per candidate: first wins ties, then last, then middle."""
    first = (np.asarray(c.pp) == 1) | (totals["first"] >= np.maximum(totals["last"], totals["middle"]))
    last = ~first & (totals["last"] >= totals["middle"])
    return {"first": first, "last": last}


def _pick(slowest: dict, values: dict) -> np.ndarray:
    """The value of the slowest rank kind (_slowest); terms equal on every rank are taken as
    they are (np.where instead of np.choose, which is slow on broadcast grids)."""
    f, mid, la = values["first"], values["middle"], values["last"]
    if f is mid and mid is la:
        return f
    return np.where(slowest["first"], f, np.where(slowest["last"], la, mid))


def _breakdown(slowest, costs, counts, extra, m, shares=None) -> dict[str, np.ndarray]:
    """The per-micro-batch terms of the slowest rank, times m: compute, recompute and the
    exposed TP, CP, EP, p2p and DP communication (the once-per-step terms are added by evaluate)."""
    per_block = {"compute": "compute", "recompute": "recompute", "tp_comm": "tp", "cp_comm": "cp",
                 "ep_comm": "ep"}
    out = {}
    for name in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "offload",
                 "host"):
        term = per_block.get(name)
        values = {k: (_stage_work(costs, counts[k], term, _share(shares, k)) if term else 0.0)
                  + extra[k].get(name, 0.0)
                  for k in extra}
        out[name] = m * _pick(slowest, values)
    return out


def _throughput(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c, step,
                causal_flops: bool) -> dict[str, np.ndarray]:
    """tokens/s, model TFLOP/s per GPU, MFU and HFU (formulas.md 4.1-4.3) of a step time. MFU and
    HFU are on the dense 16-bit peak in every precision (fp8_hardware.md 6: comparable across
    precisions); FP8 adds ``mfu_fp8_peak``, the same FLOPs over the FP8 peak (dgxc-benchmarking's
    convention)."""
    gpus = np.asarray(c.gpus, dtype=np.float64)
    f_model = mf.model_flops_per_step(model, training.seq_length, training.global_batch_size,
                                         c.tp, causal=causal_flops)
    f_hw = f_model + mf.recompute_flops_per_step(model, training.seq_length,
                                                    training.global_batch_size, c.recompute,
                                                    causal=causal_flops,
                                                    full_share=_full_share(model, c))
    peak = precision.dtype_peak(hw, training)
    out = {"tokens_per_s": training.global_batch_size * training.seq_length / step,
           "model_tflops_per_gpu": f_model / (step * gpus) / 1e12,
           "mfu": f_model / (step * gpus * peak),
           "hfu": f_hw / (step * gpus * peak)}
    if precision.is_fp8(training):  # the FP8-peak figure NVIDIA's benchmarks print, beside it
        out["mfu_fp8_peak"] = f_model / (step * gpus * precision.linear_peak(hw, training))
    return out


def _full_share(model: ModelSpec, c):
    """Share of the model's layers recomputed in full per micro-batch: 1, or with the block
    method (recompute_num_layers > 0) LayoutDegrees.recomputed_layers / L."""
    n = np.asarray(c.recompute_num_layers)
    if not np.any(n > 0):
        return 1.0
    return np.where(n > 0, c.recomputed_layers(model.num_layers) / model.num_layers, 1.0)


def estimate_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                    layout: Layout) -> Estimate:
    """Evaluate one layout (arrays of length 1)."""
    return evaluate(model, hw, training, Candidates.from_layouts([layout]))
