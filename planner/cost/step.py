"""Puts the terms together: memory per GPU, step time and its breakdown, tokens/s, MFU, HFU.

Composition (formulas.md 7.1):
    T_step = T_pipe(stage times per micro-batch, bubble) + exposed DP/ZeRO + optimizer
where one micro-batch on a stage = layers x (forward + backward + recompute + exposed TP) + edge
work + exposed pipeline p2p, and exposed ZeRO-2/3 traffic per micro-batch. All arrays (N,).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import HardwareProfile, Layout, ModelSpec, TrainingSpec
from ..space import Candidates
from . import compute, context, flops, memory, pipeline
from .collectives import Links, collective_time, p2p_time, placement

MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other")
TIME_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm", "bubble", "optimizer")


@dataclass(frozen=True)
class Estimate:
    """Predictions for N candidates: ``memory[term]``, ``time[term]`` and ``throughput[key]``, each (N,).

    memory (bytes, on the GPU with the highest peak): weights, gradients, optimizer,
    activations, other (buffers + framework allowance), total, capacity; ``fits`` (bool).
    time (seconds): step and its terms (sum of TIME_TERMS == step), plus bubble_fraction: the
    bubble over the busiest stage's work in the step (m x its per-micro-batch compute,
    recomputation and exposed communication), Narayanan's (pp-1)/(vpp*m) for equal stages.
    throughput: tokens_per_s, model_tflops_per_gpu, mfu, hfu (fractions of the dense peak).
    """

    candidates: Candidates
    memory: dict[str, np.ndarray]
    time: dict[str, np.ndarray]
    throughput: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def fits(self) -> np.ndarray:
        """Which layouts fit in HBM, (N,) bool. ValueError for a summary estimate (evaluate's
        ``summary=True`` computes no memory: use memory_total)."""
        if "total" not in self.memory:
            raise ValueError("a summary estimate has no memory; use cost.memory_total")
        return self.memory["total"] <= self.memory["capacity"]

    def take(self, index: np.ndarray) -> "Estimate":
        def sub(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: v[index] for k, v in d.items()}
        return Estimate(self.candidates.take(index), sub(self.memory), sub(self.time),
                        sub(self.throughput))

    def to_dict(self, i: int) -> dict:
        """Candidate i as the JSON object of ``plan3d estimate --json`` (SI units)."""
        mem = {k: float(v[i]) for k, v in self.memory.items()}
        mem["peak_stage"] = int(mem["peak_stage"])
        mem["fits"] = bool(self.fits[i])
        return {
            "layout": self.candidates.layout(i).model_dump(),
            "memory": mem,
            "time": {k: float(v[i]) for k, v in self.time.items()},
            "throughput": {k: float(v[i]) for k, v in self.throughput.items()},
        }


def _tp_comm(model: ModelSpec, training: TrainingSpec, c: Candidates, links: Links,
             layer: compute.LayerTimes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exposed TP seconds per layer per micro-batch: (forward, backward, one collective of X).

    X = 2*s*b*h bytes. Without SP: 2 all-reduces forward, 2 backward; with SP: 2 all-gathers + 2
    reduce-scatters forward, and backward 2 all-gathers + 2 reduce-scatters + 2 re-gathers of the
    stored input (formulas.md 5.4). Forward collectives are exposed; in backward Megatron overlaps
    the input-gradient all-reduce/reduce-scatter of QKV and fc1 with their weight-gradient GEMMs
    and the re-gathers with their input-gradient GEMMs, so only the excess over that window shows.
    ``training.tp_backward_overlap = False`` models the synchronous f/g operators of the original
    Megatron-LM (Shoeybi 2019; Narayanan 2021 Sec. 3.3): every backward collective is exposed.
    """
    x = 2.0 * training.seq_length * c.micro_batch_size * model.hidden_size
    n_local, n_nodes = placement(c.tp, np.ones_like(c.tp), links.gpus_per_node)
    ar = collective_time("all_reduce", x, n_local, n_nodes, links)
    ag = collective_time("all_gather", x, n_local, n_nodes, links)
    rs = collective_time("reduce_scatter", x, n_local, n_nodes, links)
    sp = c.sequence_parallel
    forward = np.where(sp, 2 * ag + 2 * rs, 2 * ar)
    fixed = np.where(sp, 2 * ag, 0.0)
    hidden = np.where(sp, 2 * rs + 2 * ag, 2 * ar)
    window = 2 * layer.column_parallel_share * layer.gemm_forward
    if not training.tp_backward_overlap:  # synchronous f/g operators (Megatron-LM of 2019-21)
        window = np.zeros_like(window)
    backward = fixed + np.maximum(0.0, hidden - window)
    return forward, backward, np.where(sp, rs, ar)


def _dp_times(params: np.ndarray, training: TrainingSpec, c: Candidates, links: Links):
    """(once-per-step seconds, per-micro-batch seconds) of DP/ZeRO collectives for ``params``/GPU.

    ZeRO 0: grad all-reduce; 1 (distributed optimizer): grad reduce-scatter + param all-gather;
    2: grad reduce-scatter every micro-batch + param all-gather; 3: per micro-batch param
    all-gather twice (forward, backward) + grad reduce-scatter (formulas.md 5.6). DP ranks are tp
    apart (Megatron order tp-dp-pp). With ``training.zero3_throughput`` (an implementation-bound
    ZeRO-3, TrainingSpec) a ZeRO-3 collective takes at least the bytes each GPU receives,
    (n-1)/n of the gathered or reduced tensor, divided by that rate. Returns (N,) seconds:
    (step grad, step param, per-micro-batch forward, per-micro-batch backward).
    """
    n_local, n_nodes = placement(c.dp, c.tp, links.gpus_per_node)
    grad = params * training.grad_bytes
    weight = params * 2.0
    ar = collective_time("all_reduce", grad, n_local, n_nodes, links)
    rs = collective_time("reduce_scatter", grad, n_local, n_nodes, links)
    ag = collective_time("all_gather", weight, n_local, n_nodes, links)
    z = c.zero_stage
    if training.zero3_throughput is not None:
        received = (c.dp - 1) / np.asarray(c.dp, dtype=np.float64) / training.zero3_throughput
        ag = np.where(z == 3, np.maximum(ag, weight * received), ag)
        rs = np.where(z == 3, np.maximum(rs, grad * received), rs)
    step_grad = np.where(z == 0, ar, np.where(z == 1, rs, 0.0))
    step_param = np.where((z == 1) | (z == 2), ag, 0.0)
    mb_forward = np.where(z == 3, ag, 0.0)
    mb_backward = np.where(z == 3, ag + rs, np.where(z == 2, rs, 0.0))
    return step_grad, step_param, mb_forward, mb_backward


def evaluate(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c: Candidates,
             causal_flops: bool = True, summary: bool = False) -> Estimate:
    """Evaluate N candidate layouts; returns an Estimate of (N,) arrays.

    ``causal_flops`` selects the model-FLOPs convention of MFU (causal attention, as Megatron-LM
    logs it since 2025-03); the compute time always uses what the kernels execute.
    Raises nothing for unfit layouts: ``fits`` says which do. ``summary=True`` (the search's
    bulk pass) returns only time step and tokens_per_s -- the same values -- and skips
    memory (see memory_total) and the breakdowns.
    """
    real, c = c, context.cost_view(c)  # CP and the distributed optimizer (cost/context.py)
    links = Links.of(hw)
    m = c.num_microbatches(training.global_batch_size)
    L = model.num_layers
    layers_per_stage = L / c.pp
    layer = compute.layer_times(model, training, hw, c)
    tp_f, tp_b, tp_one = _tp_comm(model, training, c, links, layer)
    cp_layer = None
    if real is not c and np.any(real.cp != 1):  # CP ring, exposed; repeated by full recompute
        cp_f, cp_b = context.ring_times(model, training, real, links, layer.attention_forward,
                                        layer.attention_backward)
        cp_layer = cp_f + cp_b + np.where(c.recompute == 2, cp_f, 0.0)

    recompute = np.where(c.recompute == 2, layer.forward + tp_f,
                         np.where(c.recompute == 1, layer.attention_forward, 0.0))
    per_layer_compute = layer.forward + layer.backward
    per_layer_tp = tp_f + tp_b

    # Pipeline p2p: each TP rank sends s*b*h/(t if SP) bf16 values per boundary and direction;
    # PP neighbours are tp*dp ranks apart, so they sit on other nodes once tp*dp*pp > G.
    # Narayanan 2021 Sec. 4.1 scatter/gather (Megatron-LM before Megatron-Core) also sends only
    # s*b*h/t per rank without SP. Interleaved: Megatron-Core overlaps p2p with compute
    # (overlap_p2p_comm), paying only the fill/drain; without that overlap (training.
    # overlap_p2p_comm False) every chunk's send/recv blocks: 2*vpp per micro-batch (formulas.md 5.5, 6).
    split = np.where(c.sequence_parallel | training.p2p_scatter_gather, c.tp, 1)
    p2p_bytes = 2.0 * training.seq_length * c.micro_batch_size * model.hidden_size / split
    t_p2p = np.where(c.pp > 1, p2p_time(p2p_bytes, c.tp * c.dp * c.pp > hw.gpus_per_node, links), 0.0)
    overlapped = (c.vpp > 1) & training.overlap_p2p_comm
    p2p_per_mb = np.where(overlapped, 0.0, 2 * c.vpp * t_p2p)  # blocking send/recv per chunk
    p2p_fill = np.where(overlapped, 2 * (c.pp - 1) * t_p2p, 0.0)  # overlapped: fill/drain only

    # Edge work: embedding (TP all-reduce / reduce-scatter of X) and output layer + loss
    # (SP: all-gather of its input forward, reduce-scatter backward).
    edge_first_tp = tp_one
    edge_last = compute.output_layer_time(model, training, hw, c)
    edge_last_tp = np.where(c.sequence_parallel, 2 * tp_one, 0.0)

    params_first = memory.stage_params(model, c, "first")
    params_last = memory.stage_params(model, c, "last")
    step_grad, step_param, mb_f, mb_b = _dp_times(params_first, training, c, links)
    split = pipeline.stage_layers(L, c)  # uneven pipeline splits; None when all are even
    lf, lm, ll = (layers_per_stage,) * 3 if split is None else split
    window_f = lf * layer.forward
    window_b = lf * layer.backward
    if training.overlap_grad_reduce:
        dp_per_mb = np.maximum(0.0, mb_f - window_f) + np.maximum(0.0, mb_b - window_b)
        dp_step = np.maximum(0.0, step_grad - window_b) + np.maximum(0.0, step_param - window_f)
    else:
        dp_per_mb, dp_step = mb_f + mb_b, step_grad + step_param
    # Tied embeddings with pp > 1: all-reduce of the word-embedding gradient, first <-> last stage.
    vocab = flops.padded_vocab(model.vocab_size, c.tp).astype(np.float64)
    tied = np.where((c.pp > 1) & model.tie_embeddings,
                    collective_time("all_reduce", vocab * model.hidden_size / c.tp * training.grad_bytes,
                                    np.ones_like(c.pp), np.full_like(c.pp, 2), links), 0.0)

    def held(n):  # the terms of a stage holding n layers per micro-batch
        terms = {
            "compute": n * per_layer_compute,
            "recompute": n * recompute,
            "tp_comm": n * per_layer_tp,
            "pp_comm": p2p_per_mb,
            "dp_comm": dp_per_mb,
        }
        if cp_layer is not None:
            terms["cp_comm"] = n * cp_layer
        return terms

    single = c.pp == 1
    # Stage totals, factored (n layers x per-layer sum + per-micro-batch terms + edges): the same
    # sums as adding each stage's terms, with fewer passes over the (broadcast) candidate arrays.
    per_layer_all = per_layer_compute + recompute + per_layer_tp
    if cp_layer is not None:
        per_layer_all = per_layer_all + cp_layer
    shared = p2p_per_mb + dp_per_mb
    middle_total = lm * per_layer_all + shared
    extra_first = edge_first_tp + np.where(single, edge_last + edge_last_tp, 0.0)
    extra_last = edge_last + edge_last_tp
    t_pipe, bubble = pipeline.even_pipeline_time(middle_total, extra_first, extra_last,
                                                 c.pp, c.vpp, m)
    if split is not None:  # the uneven splits by the general schedule; the even ones as above,
        # so that a layout's numbers do not depend on what else is evaluated with it
        totals = {"first": lf * per_layer_all + shared + extra_first, "middle": middle_total,
                  "last": ll * per_layer_all + shared + extra_last}
        t_general, bubble_general = pipeline.pipeline_time(totals["first"], totals["middle"],
                                                           totals["last"], c.pp, c.vpp, m)
        uneven = c.first_stage_layers > 0
        t_pipe = np.where(uneven, t_general, t_pipe)
        bubble = np.where(uneven, bubble_general, bubble)
    params = {"first": params_first, "last": params_last}
    if split is not None:  # uneven split: the first middle rank can hold the most
        params["middle"] = memory.stage_params(model, c, "middle")
    params_most = np.maximum.reduce(list(params.values()))
    params_updated = params_most / np.where(c.zero_stage >= 1, c.dp, 1)
    grad_buffer = params_most / np.where(c.zero_stage >= 2, c.dp, 1)
    t_opt = compute.optimizer_time(params_updated, hw, training, grad_buffer)
    step = t_pipe + (p2p_fill + dp_step + tied + t_opt)  # the once-per-step terms, small shapes
    if summary:
        return Estimate(real, {}, {"step": step},
                        {"tokens_per_s": training.global_batch_size * training.seq_length / step})
    if split is None:
        totals = {"first": middle_total + extra_first, "middle": middle_total,
                  "last": middle_total + extra_last}
    base = held(lm)
    bf, bl = (base, base) if split is None else (held(lf), held(ll))
    stages = {
        "first": {**bf, "compute": bf["compute"] + np.where(single, edge_last, 0.0),
                  "tp_comm": bf["tp_comm"] + edge_first_tp + np.where(single, edge_last_tp, 0.0)},
        "middle": base,
        "last": {**bl, "compute": bl["compute"] + edge_last,
                 "tp_comm": bl["tp_comm"] + edge_last_tp},
    }
    # The slowest stage's terms (first wins ties, then last). Terms equal on every stage are
    # taken as they are; np.where instead of np.choose, which is slow on broadcast grids.
    first_slowest = single | (totals["first"] >= np.maximum(totals["last"], totals["middle"]))
    last_slowest = ~first_slowest & (totals["last"] >= totals["middle"])

    def pick(term):
        f, mid, la = stages["first"][term], stages["middle"][term], stages["last"][term]
        if f is mid and mid is la:
            return f
        return np.where(first_slowest, f, np.where(last_slowest, la, mid))

    picked = {term: pick(term) for term in base}
    time = {term: m * picked.get(term, 0.0)
            for term in ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm")}
    time["pp_comm"] = time["pp_comm"] + p2p_fill
    time["dp_comm"] = time["dp_comm"] + dp_step + tied
    time["bubble"] = bubble
    time["optimizer"] = t_opt
    time["step"] = step
    time["bubble_fraction"] = bubble / (m * np.maximum(sum(picked[t] for t in base), 1e-30))

    mem = _memory(model, hw, training, c, params)
    gpus = (c.tp * c.pp * c.dp).astype(np.float64)
    f_model = flops.model_flops_per_step(model, training.seq_length, training.global_batch_size,
                                         c.tp, causal=causal_flops)
    f_hw = f_model + flops.recompute_flops_per_step(model, training.seq_length,
                                                    training.global_batch_size, c.recompute,
                                                    causal=causal_flops)
    peak = compute.peak_flops(hw, training)
    step = time["step"]
    throughput = {
        "tokens_per_s": training.global_batch_size * training.seq_length / step,
        "model_tflops_per_gpu": f_model / (step * gpus) / 1e12,
        "mfu": f_model / (step * gpus * peak),
        "hfu": f_hw / (step * gpus * peak),
    }
    if real is not c:  # CP ring receive buffers
        ring = context.ring_buffer_bytes(model, training, real)
        mem["other"], mem["total"] = mem["other"] + ring, mem["total"] + ring
    return Estimate(real, mem, time, throughput)


def memory_total(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                 c: Candidates) -> np.ndarray:
    """Per-GPU peak memory in bytes of the most loaded stage, for N (or broadcast-shaped)
    candidates: the ``memory["total"]`` of evaluate(), without the step time. The search checks
    fit with it first and computes step times only for the layouts that fit."""
    real, c = c, context.cost_view(c)
    params = {"first": memory.stage_params(model, c, "first"),
              "last": memory.stage_params(model, c, "last")}
    if pipeline.stage_layers(model.num_layers, c) is not None:
        params["middle"] = memory.stage_params(model, c, "middle")
    total = _memory(model, hw, training, c, params, summary=True)["total"]
    if real is not c:  # CP ring receive buffers
        total = total + context.ring_buffer_bytes(model, training, real)
    return total


def _memory(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c: Candidates,
            params: dict[str, np.ndarray], summary: bool = False) -> dict[str, np.ndarray]:
    """Per-GPU memory terms of the stage with the highest total (first or last; with an uneven
    pipeline split, ``params`` has "middle" too: the first middle rank, whose stages hold more
    layers than the edges)."""
    transient = memory.transient_bytes(model, training, c) + hw.framework_overhead
    per_stage = []
    uneven = "middle" in params
    activations = memory.activation_bytes_by_stage(model, training, c, tuple(params))
    for stage, stage_params in params.items():
        terms = memory.model_state_bytes(stage_params, c.zero_stage, c.dp, training)
        terms["activations"] = activations[stage]
        terms["other"] = transient
        # States and buffers do not vary with recompute/vpp: add them on their smaller
        # broadcast shape, then add the activations once.
        terms["total"] = (terms["weights"] + terms["gradients"] + terms["optimizer"]
                          + transient) + terms["activations"]
        per_stage.append(terms)
    first, last = per_stage[:2]
    if summary:
        total = np.maximum(first["total"], last["total"])
        if uneven:
            total = np.maximum(total, per_stage[2]["total"])
        return {"total": total, "capacity": np.broadcast_to(float(hw.gpu.hbm_capacity), total.shape)}
    use_last = last["total"] > first["total"]
    mem = {k: np.where(use_last, last[k], first[k]) for k in (*MEMORY_TERMS, "total")}
    peak = np.where(use_last, c.pp - 1, 0)
    if uneven:
        middle = per_stage[2]
        use_middle = middle["total"] > mem["total"]
        mem = {k: np.where(use_middle, middle[k], mem[k]) for k in mem}
        peak = np.where(use_middle, 1, peak)
    mem["capacity"] = np.full(np.shape(mem["total"]), float(hw.gpu.hbm_capacity))
    mem["peak_stage"] = peak.astype(np.float64)
    return mem


def estimate_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                    layout: Layout) -> Estimate:
    """Evaluate one layout (arrays of length 1)."""
    return evaluate(model, hw, training, Candidates.from_layouts([layout]))
