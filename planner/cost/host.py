"""Host (CPU) time: what a GPU waits for when its host issues work slower than the GPU runs it.

The framework's host launches every eager device operation of a block (a kernel or a
collective, with the Python and C++ code that issues it: hardware_spec.HostCPU.op_time each);
CUDA graphs replace a captured region's operations by one replay. While the host is ahead of
the GPU it costs nothing; where it falls behind the GPU idles. A dropless MoE layer's forward
holds one blocking device-to-host copy of the routed token counts (Megatron-Core's alltoall
dispatcher syncs at ``cuda_sync_point``, token_dispatcher.py L921-960; HybridEP without a rank
capacity and DeepEP likewise, fused_a2a.py L113-138, L417 @d98e8a64): the host cannot run ahead
past it, so each side of it costs max(GPU time, host time); a drop-and-pad layer (capacity
factor) has none (L517-538). Megatron-Core's EP overlap merges one micro-batch's forward with
another's backward into one scheduled node, so that backward can no longer run ahead of the
sync either (Megatron-Bridge PR #1760 turned it off "due to CPU overhead": 20.1 -> 16.9 s on
B200 Qwen3-235B; reference/moe_performance.md 3.2-3.3).

Per micro-batch on one GPU of a pipeline rank (formulas.md 7.4):
  no sync:   max(0, H - G) over the rank's blocks, forward and backward;
  with sync: per MoE layer max(0, H_pre - G_pre) + max(0, H_post - G_post) (pre: its attention
             and the router up to the sync; post: dispatch, experts, combine), the backward
             max(0, H_b - G_b) over the rank; with the EP overlap the backward joins the
             post-sync side of each layer's node.
G: the block's GPU time (compute and exposed communication), H = op_time x its operations.

Operation counts per block and micro-batch are read from the code (Megatron-Core @d98e8a64
with Transformer Engine 2.9-2.16; reference/software_axes_facts.md D.3, an estimate from
reading, not a profile): attention 8 forward / 13 backward (MLA 12 / 20; QK norms +2 / +2), a
dense MLP 5 / 11, TP with SP +2 / +3 collectives per block; FP8 quantization per linear input
(forward) and output gradient (backward): per-tensor current scaling 3 launches (amax,
scale, cast; quantizer.cpp L857-895), block scales 1; an MoE layer (alltoall, ep > 1): 25 +
2 E_loc forward and 20 + 4 E_loc backward (router, permutation, all-to-alls, one GEMM per
local expert per pass on TE GroupedLinear's streams: cublaslt_gemm.cu L969-1020), FP8
quantization per local expert and GEMM input, HybridEP 8 fewer each way, DeepEP 3, biased
experts (GPT-OSS's per-expert bias loop, experts.py L608-627, where the framework runs the
unfused path: training.moe_unfused_bias_glu) 3 E_loc more each way; of the
MoE forward, the router's 10 come before the sync. Arrays broadcast over candidates; seconds.
"""

from __future__ import annotations

import numpy as np

from ..framework_spec import CUDA_GRAPHS
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .model_counts import ATTENTION, MLP, MOE, WINDOW
from .moe import dispatcher_is

ROUTER_OPS = 10.0  # the MoE forward's operations before the sync: router GEMM, top-k, aux loss, counts
QUANTIZE_OPS = {"bf16": 0.0, "fp8": 3.0, "fp8-blockwise": 1.0, "mxfp8": 1.0}


def _graphs(c, name: str) -> np.ndarray:
    return np.asarray(c.cuda_graphs) == CUDA_GRAPHS.index(name)


def _dense_ops(model: ModelSpec, training: TrainingSpec, c, kind: str) -> tuple:
    """(forward, backward) eager operations of one attention or dense-MLP block."""
    q = QUANTIZE_OPS[training.precision]
    tp = (np.asarray(c.tp) > 1) & np.asarray(c.sequence_parallel, dtype=bool)
    if kind == MLP:
        f, b = 5.0 + 2 * q, 11.0 + 2 * q
    else:
        mla = model.attention_kind == "mla"
        norms = 2.0 if model.qk_norm != "none" else 0.0
        f, b = (12.0 if mla else 8.0) + norms + 2 * q, (20.0 if mla else 13.0) + norms + 2 * q
    return f + 2.0 * tp, b + 3.0 * tp


def _moe_ops(model: ModelSpec, training: TrainingSpec, c) -> tuple:
    """(forward, backward) eager operations of one MoE block (its shared experts included)."""
    e_loc = model.moe.num_experts / np.asarray(c.ep, dtype=np.float64)
    q = QUANTIZE_OPS[training.precision]
    # the per-expert bias loop is the unfused path of training.moe_unfused_bias_glu
    bias = 3.0 * e_loc if model.bias and training.moe_unfused_bias_glu else 0.0
    saved = np.where(dispatcher_is(c, "hybridep"), 8.0, np.where(dispatcher_is(c, "deepep"), 3.0, 0.0))
    f = 25.0 + 2 * e_loc + 2 * q * e_loc + bias - saved
    b = 20.0 + 4 * e_loc + 2 * q * e_loc + bias - saved
    if model.moe.shared_experts:
        sf, sb = _dense_ops(model, training, c, MLP)
        f, b = f + sf, b + sb
    return f, b


def block_ops(model: ModelSpec, training: TrainingSpec, c, kind: str) -> tuple:
    """(forward before the sync, forward after it, backward) host operations of one block of
    ``kind`` per micro-batch, with the candidates' CUDA graphs: layers captures an attention
    block and a dense MLP (and a drop-and-pad MoE block) as one replay each way and a dropless
    MoE block's router and preprocessing as one, but beside EP overlap neither an MLP nor an
    MoE block (transformer_config.py L3063-3071 @d98e8a64: no mlp or moe graph modules with
    --overlap-moe-expert-parallel-comm); full_iteration leaves none per layer. Broadcast float
    arrays."""
    layers, whole = _graphs(c, "layers"), _graphs(c, "full_iteration")
    if kind in (MLP, MOE) and model.moe is not None:
        layers_ffn = layers & ~np.asarray(c.moe_a2a_overlap, dtype=bool)
    else:
        layers_ffn = layers
    if kind != MOE:
        f, b = _dense_ops(model, training, c, kind)
        captured = layers if kind != MLP else layers_ffn
        f, b = np.where(captured, 1.0, f), np.where(captured, 1.0, b)
        return np.where(whole, 0.0, f), 0.0, np.where(whole, 0.0, b)
    f, b = _moe_ops(model, training, c)
    dropless = training.moe_capacity_factor is None
    pre = np.where(layers, 1.0, ROUTER_OPS)
    post = np.where(layers_ffn & (not dropless), 0.0, f - ROUTER_OPS)
    b = np.where(layers_ffn & (not dropless), 1.0, b)
    return np.where(whole, 0.0, pre), np.where(whole, 0.0, post), np.where(whole, 0.0, b)


def has_sync(training: TrainingSpec, c) -> np.ndarray:
    """Where an MoE forward blocks its host once per layer: dropless routing without a
    full-iteration graph. Bool array."""
    return (training.moe_capacity_factor is None) & ~_graphs(c, "full_iteration")


def block_host(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
               costs: dict) -> dict | None:
    """Per block kind of ``costs`` (step.LayerCost): (host seconds before the sync, after it,
    backward; the block's host seconds in all; its GPU seconds without recomputation), once
    per evaluation for rank_host_time. None where the hardware profile states no host."""
    if hw.host_cpu is None:
        return None
    op = float(hw.host_cpu.op_time)
    out = {}
    for kind, cost in costs.items():
        pre, post, back = block_ops(model, training, c, kind)
        out[kind] = (op * pre, op * post, op * back, op * (pre + post + back), cost.total - cost.recompute)
    return out


def rank_host_time(model: ModelSpec, training: TrainingSpec, c, host: dict | None, times: dict,
                   blocks: dict, overlap) -> np.ndarray:
    """Exposed host seconds per micro-batch of one pipeline rank holding ``blocks`` ({kind:
    count}, blocks.rank_blocks), given its blocks' host and GPU seconds (``host``: block_host;
    the GPU's split into forward and backward by ``times``' compute, compute.LayerTimes) and
    where the EP overlap runs (``overlap``, bool array). 0 where ``host`` is None."""
    if host is None:
        return 0.0
    # without a sync the host runs ahead over the whole rank: only the totals matter
    free = np.maximum(0.0, sum(blocks[k] * (host[k][3] - host[k][4]) for k in blocks))
    n_moe = blocks.get(MOE, 0)
    if model.moe is None or not np.any(n_moe) or not np.any(has_sync(training, c)):
        return free
    sync = has_sync(training, c) & (np.asarray(n_moe) > 0)
    if WINDOW not in blocks:  # one attention kind: the per-layer segments hold for every rank
        return np.where(sync, _synced_layers(host, times, blocks, overlap), free)
    gpu_f, gpu_b = _gpu_split(host, times, blocks)
    return np.where(sync, _synced(blocks, gpu_f, gpu_b, {k: host[k][:3] for k in blocks}, overlap), free)


def _gpu_split(host: dict, times: dict, kinds) -> tuple[dict, dict]:
    """({kind: forward GPU seconds}, {kind: backward}) of each block, split by its compute."""
    gpu_f, gpu_b = {}, {}
    for kind in kinds:
        t = times[kind]
        share = t.forward / np.maximum(t.forward + t.backward, 1e-30)
        gpu_f[kind], gpu_b[kind] = host[kind][4] * share, host[kind][4] * (1.0 - share)
    return gpu_f, gpu_b


def _synced_layers(host: dict, times: dict, blocks: dict, overlap) -> np.ndarray:
    """_synced for a rank whose attention blocks are all of one kind: the per-layer segments
    (rank-independent, kept in ``host`` for the evaluation's other ranks) times the rank's
    block counts. The same values as _synced."""
    if "_layer" not in host:
        kinds = [k for k in (ATTENTION, MLP, MOE) if k in host]
        gpu_f, gpu_b = _gpu_split(host, times, kinds)
        h_af, h_ab, g_af, g_ab = host[ATTENTION][0], host[ATTENTION][2], gpu_f[ATTENTION], gpu_b[ATTENTION]
        hm = host[MOE]
        layer = dict(pre=np.maximum(0.0, h_af + hm[0] - g_af), post=np.maximum(0.0, hm[1] - gpu_f[MOE]),
                     node=np.maximum(0.0, hm[1] + h_ab + hm[2] - gpu_f[MOE] - g_ab - gpu_b[MOE]),
                     af=h_af - g_af, ab=h_ab - g_ab, mb=h_ab + hm[2] - g_ab - gpu_b[MOE])
        if MLP in host:
            layer.update(mf=host[MLP][0] - gpu_f[MLP], mbk=host[MLP][2] - gpu_b[MLP])
        host["_layer"] = layer
    lay = host["_layer"]
    n_moe = blocks[MOE]
    n_dense = blocks[ATTENTION] - n_moe
    dense_f, dense_b = n_dense * lay["af"], n_dense * lay["ab"]
    if MLP in blocks and "mf" in lay:
        dense_f, dense_b = dense_f + blocks[MLP] * lay["mf"], dense_b + blocks[MLP] * lay["mbk"]
    ahead_f = np.maximum(0.0, dense_f)
    plain = n_moe * (lay["pre"] + lay["post"]) + ahead_f + np.maximum(0.0, dense_b + n_moe * lay["mb"])
    merged = n_moe * (lay["pre"] + lay["node"]) + ahead_f + np.maximum(0.0, dense_b)
    return np.where(overlap, merged, plain)


def _never_behind(blocks: dict, gpu_f: dict, gpu_b: dict, host: dict, g_af, g_ab, h_af, h_ab) -> bool:
    """Whether no candidate's host falls behind in any segment of _synced: the most host time
    of each segment (small arrays: host ops depend on few layout fields) within the least GPU
    time of that segment. A shortcut that changes no value."""
    worst = [(h_af + host[MOE][0], g_af), (host[MOE][1], gpu_f[MOE]), (h_ab, g_ab),
             (h_ab + host[MOE][2], g_ab + gpu_b[MOE])]
    if MLP in blocks:
        worst += [(host[MLP][0], gpu_f[MLP]), (host[MLP][2], gpu_b[MLP])]
    return all(float(np.max(h)) <= float(np.min(g)) for h, g in worst)


def _synced(blocks: dict, gpu_f: dict, gpu_b: dict, host: dict, overlap) -> np.ndarray:
    """Exposed host seconds of a rank whose MoE layers sync once each in their forward: each
    MoE layer's forward in two segments (its attention and router; the rest), its dense
    layers' forward run ahead together, the backward together (with the EP overlap each MoE
    layer's backward joins the post-sync segment of its node)."""
    attn = [k for k in (ATTENTION, WINDOW) if k in blocks]
    n_layers = sum(blocks[k] for k in attn)
    avg = lambda d, i=None: sum(blocks[k] * (d[k] if i is None else d[k][i]) for k in attn) / n_layers  # noqa: E731
    g_af, g_ab, h_af, h_ab = avg(gpu_f), avg(gpu_b), avg(host, 0), avg(host, 2)
    n_moe, n_dense = blocks[MOE], n_layers - blocks[MOE]
    if _never_behind(blocks, gpu_f, gpu_b, host, g_af, g_ab, h_af, h_ab):
        return 0.0
    pre = np.maximum(0.0, h_af + host[MOE][0] - g_af)
    post = np.maximum(0.0, host[MOE][1] - gpu_f[MOE])
    node = np.maximum(0.0, host[MOE][1] + h_ab + host[MOE][2] - gpu_f[MOE] - g_ab - gpu_b[MOE])
    mlp = MLP in blocks
    dense_f = n_dense * (h_af - g_af) + (blocks[MLP] * (host[MLP][0] - gpu_f[MLP]) if mlp else 0.0)
    dense_b = n_dense * (h_ab - g_ab) + (blocks[MLP] * (host[MLP][2] - gpu_b[MLP]) if mlp else 0.0)
    moe_b = n_moe * (h_ab + host[MOE][2] - g_ab - gpu_b[MOE])
    plain = n_moe * (pre + post) + np.maximum(0.0, dense_f) + np.maximum(0.0, dense_b + moe_b)
    merged = n_moe * (pre + node) + np.maximum(0.0, dense_f) + np.maximum(0.0, dense_b)
    return np.where(overlap, merged, plain)
