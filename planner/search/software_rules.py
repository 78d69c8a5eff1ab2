"""The rules of the training software's own switches (layout.axes' software axes): what the
framework runs (framework_spec.Rules: tp_comm_overlap, moe_dispatchers, moe_a2a_overlap,
cuda_graphs) and what it refuses together, as named, vectorized masks (True = allowed).

Megatron-Core's constraints are read at NVIDIA/Megatron-LM @d98e8a64ddf3 (transformer_config.py
= TC, token_dispatcher.py = TD, arguments.py = ARGS; reference/software_axes_facts A-C).
"""

from __future__ import annotations

import numpy as np

from ..cost.offload import uses_host_memory
from ..cost.precision import blackwell
from ..framework_spec import CUDA_GRAPHS, MOE_DISPATCHERS, PIPELINE_SCHEDULES, FrameworkProfile
from ..layout import RECOMPUTE_CODES
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .job_rules import megatron_core

TP_OVERLAP_RULE = "TP communication overlap needs sequence parallelism (tp > 1)"
TP_OVERLAP_HOST_RULE = "TP communication overlap needs the TP group within one host"


def _code(c, name: str) -> np.ndarray:
    return np.asarray(getattr(c, name))


def software_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec,
                   c, hw: HardwareProfile | None = None) -> dict[str, np.ndarray]:
    """{rule: bool mask} of the software axes of candidates ``c`` under ``profile``; with
    ``hw`` also what the hardware decides (the host's GPUs, the GPU's SMs, Blackwell)."""
    tp_ovl = _code(c, "tp_comm_overlap").astype(bool)
    out = _tp_overlap_masks(profile, model, c, tp_ovl, hw)
    out.update(_dispatcher_masks(profile, model, training, c, hw))
    out.update(_a2a_overlap_masks(profile, model, c, tp_ovl, hw))
    out.update(_graph_masks(profile, model, training, c))
    return out


def _tp_overlap_masks(profile: FrameworkProfile, model: ModelSpec, c, tp_ovl, hw) -> dict:
    """TP communication overlap: offered; ARGS L1431-1442: --tp-comm-overlap asserts
    --sequence-parallel (forced off at tp 1); Transformer Engine's userbuffers map the TP
    group's buffers with CUDA multicast / IPC handles, within one host (TE examples/pytorch/
    comm_gemm_overlap/README.md L3-11, NVIDIA/TransformerEngine#1071); Megatron-Core gives
    userbuffers only to the linears named qkv, proj, fc1 and fc2, and the first other name
    (MLA's q_down_proj, ...) turns the overlap off on the shared config (extensions/
    transformer_engine.py L1176-1186): refused for MLA rather than costed as running; the
    schedules a profile refuses beside it (``tp_comm_overlap_schedules_refused``: torchtitan's
    async TP compiles the model, which PyTorch's zero-bubble and V schedules refuse); the SM
    margin it is costed with needs the GPU's SM count."""
    if not np.any(tp_ovl):
        return {TP_OVERLAP_RULE: ~tp_ovl}
    r, d = profile.rules, profile.display
    out = {TP_OVERLAP_RULE: ~tp_ovl | (np.asarray(c.sequence_parallel) & (np.asarray(c.tp) > 1))}
    if not r.tp_comm_overlap:
        out[f"{d} has no TP communication overlap"] = ~tp_ovl
    if r.tp_comm_overlap_schedules_refused:
        refused = [PIPELINE_SCHEDULES.index(name) for name in r.tp_comm_overlap_schedules_refused]
        out[f"{d}: TP communication overlap (async TP compiles the model) not with the "
            f"{' / '.join(r.tp_comm_overlap_schedules_refused)} schedule, which refuses compiled "
            "stages"] = ~tp_ovl | ~np.isin(np.asarray(c.pipeline_schedule), refused)
    if megatron_core(profile) and model.attention_kind == "mla":
        out[f"{d}: TP communication overlap covers no MLA linear (qkv, proj, fc1, fc2 only)"] = ~tp_ovl
    if hw is not None:
        out[TP_OVERLAP_HOST_RULE] = ~tp_ovl | (np.asarray(c.tp) <= hw.gpus_per_node)
        if hw.gpu.sm_count is None:
            out["TP communication overlap needs the GPU's SM count (gpu.sm_count)"] = ~tp_ovl
    return out


def _dispatcher_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec, c,
                      hw) -> dict[str, np.ndarray]:
    """The dispatcher the framework runs and the cluster has (with ``hw``: its
    moe_dispatch.backends); without experts the default; DeepEP's assertions: etp*ep > 1 and no
    padding to capacity (TC L1754-1761, which a capacity factor means here)."""
    r, d = profile.rules, profile.display
    disp = _code(c, "moe_dispatcher")
    out: dict[str, np.ndarray] = {}
    if model.moe is None:
        out["a token dispatcher and EP overlap need an MoE model"] = \
            (disp == 0) & ~_code(c, "moe_a2a_overlap").astype(bool)
        return out
    offered = [MOE_DISPATCHERS.index(x) for x in r.moe_dispatchers]
    if len(offered) < len(MOE_DISPATCHERS):
        out[f"{d} dispatches tokens with {' / '.join(r.moe_dispatchers)}"] = np.isin(disp, offered)
    # TD L1836: "DeepEP dispatcher requires TPxEP > 1", TP being the expert TP group
    deepep = disp == MOE_DISPATCHERS.index("deepep")
    out["the DeepEP dispatcher needs etp*ep > 1"] = ~deepep | (np.asarray(c.etp) * np.asarray(c.ep) > 1)
    if training.moe_capacity_factor is not None:
        out["the DeepEP dispatcher does not pad to a capacity (--moe-capacity-factor)"] = ~deepep
    if hw is not None:
        have = {"alltoall", "allgather"} | set(getattr(hw.moe_dispatch, "backends", None) or [])
        codes = [MOE_DISPATCHERS.index(x) for x in sorted(have)]
        out[f"{hw.name} runs the dispatchers {' / '.join(sorted(have))} (its moe_dispatch)"] = \
            np.isin(disp, codes)
    return out


def _a2a_overlap_masks(profile: FrameworkProfile, model: ModelSpec, c, tp_ovl, hw) -> dict:
    """Megatron-Core's EP overlap: offered at all; TC L3002-3072: EP > 1, VPP with PP > 1, the
    alltoall or flex dispatcher, no full recomputation and no recompute_num_layers, at most one
    MTP layer; beside TP communication overlap it needs CUDA_DEVICE_MAX_CONNECTIONS > 1 where
    TE userbuffers need 1 before Blackwell (ARGS L1466-1479, moe/README.md L437): not both
    there (without ``hw``, nowhere)."""
    r, d = profile.rules, profile.display
    on = _code(c, "moe_a2a_overlap").astype(bool)
    if not np.any(on):
        return {}
    if not r.moe_a2a_overlap:
        return {f"{d} has no EP communication overlap": ~on}
    ok = (np.asarray(c.ep) > 1) & ((np.asarray(c.pp) == 1) | (np.asarray(c.vpp) > 1)) & \
        (np.asarray(c.recompute) != RECOMPUTE_CODES["full"]) & \
        (_code(c, "moe_dispatcher") != MOE_DISPATCHERS.index("allgather")) & \
        (model.mtp_layers <= 1)
    out = {f"{d}: EP overlap needs ep > 1, vpp > 1 with pp > 1, no full recompute, the alltoall "
           "or a fused dispatcher and at most one MTP layer": ~on | ok}
    graphs = _code(c, "cuda_graphs") == CUDA_GRAPHS.index("layers")
    if model.bias or model.qkv_bias:  # ARGS L1924-1927: delayed wgrad beside graphed attention
        out[f"{d}: EP overlap with layer CUDA graphs needs attention without biases"] = ~(on & graphs)
    # Megatron-FSDP's adapter refuses EP overlap beside per-layer graphs
    out[f"{d}: EP overlap with layer CUDA graphs not under Megatron-FSDP (ZeRO-2/3)"] = \
        ~(on & graphs & (np.asarray(c.zero_stage) >= 2))
    if hw is None or not blackwell(hw):
        out[f"{d}: EP overlap and TP communication overlap need opposite "
            "CUDA_DEVICE_MAX_CONNECTIONS before Blackwell"] = ~(on & tp_ovl)
    return out


def _graph_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec, c) -> dict:
    """CUDA-graph scopes: offered; TC L2795-2975: full recomputation only with full_iteration
    graphs, activation offload neither with TE layer graphs; a full-iteration graph needs a
    static step, which a dropless MoE lacks without a capacity (TC L1364-1381: HybridEP with
    --moe-expert-rank-capacity-factor and the paged stash, cuda_graph.md L170-182)."""
    r, d = profile.rules, profile.display
    graphs = _code(c, "cuda_graphs")
    if not np.any(graphs > 0):
        return {}
    offered = [CUDA_GRAPHS.index(x) for x in r.cuda_graphs]
    layers, full_iteration = CUDA_GRAPHS.index("layers"), CUDA_GRAPHS.index("full_iteration")
    out = {(f"{d} captures CUDA graphs {' / '.join(r.cuda_graphs)}" if len(offered) > 1 else
            f"{d} captures no CUDA graphs"): np.isin(graphs, offered),
           f"{d}: layer CUDA graphs neither with full recomputation nor with activation offload":
               (graphs != layers) | ((np.asarray(c.recompute) != RECOMPUTE_CODES["full"])
                                     & ~uses_host_memory(c))}
    if model.dropout > 0:  # TC L2876-2885: attention dropout with graphed core-attention recompute
        out[f"{d}: layer CUDA graphs with attention dropout not beside selective recompute"] = \
            (graphs != layers) | (np.asarray(c.recompute) != RECOMPUTE_CODES["selective"])
    if model.moe is not None and training.moe_capacity_factor is None:
        out[f"{d}: a full-iteration CUDA graph of a dropless MoE needs a static capacity "
            "(--moe-capacity-factor)"] = graphs != full_iteration
    return out
