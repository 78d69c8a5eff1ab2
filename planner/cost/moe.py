"""Expert parallelism: token dispatch and combine of an MoE block (moe.md 3-4).

Experts fold over a pipeline stage's tp*cp*dp GPUs as etp x ep x edp (Megatron-Core parallel
folding; LayoutDegrees.edp). An MoE block receives the SP shard of the tokens, T = s*b/(cp*tp)
per GPU (blocks.moe_rows), routes each to router_topk experts and, with Megatron-Core's
alltoall dispatcher (Megatron-LM @ d98e8a64ddf3 moe/token_dispatcher.py L375-908, moe.md 4.1):
  dispatch: an all-to-all over the ep group of the T*k routed rows (h activations + the fp32
  routing probability each); with etp > 1 an all-gather of them over the etp group;
  combine: with etp > 1 a reduce-scatter over etp in the probabilities' dtype (fp32); an
  all-to-all of the T*k rows back over ep.
The backward mirrors each (all-to-all <-> all-to-all, all-gather <-> reduce-scatter); full
recompute repeats the forward's. The allgather dispatcher (moe.md 4.3) instead all-gathers the
T tokens, their probabilities and routing map over the etp*ep group and reduce-scatters the
result. Payload S is what one GPU sends (all-to-all) or the unsharded tensor (all-gather
output, reduce-scatter input), formulas.md 5.1; the busiest rank receives blocks.routed_factor times
the balanced share, which cost.comm applies to the all-to-all and expert-TP times. The
dispatcher is a layout axis (moe_dispatcher): each candidate's calls are those of its own.
"""

from __future__ import annotations

import numpy as np

from dataclasses import replace

from ..framework_spec import MOE_DISPATCHERS
from ..specs import ModelSpec, TrainingSpec
from .blocks import moe_rows
from .traffic import Collective, Elements

PROB_BYTES = 4.0  # routing probabilities in fp32 (Megatron-Core --moe-router-dtype fp32; moe.md 4.1, 8.6)
# Share of the NIC line rate DeepEP's RDMA dispatch and combine reach: 43 GB/s on 400 Gb/s
# (50 GB/s) ConnectX-7 at EP16, the lowest of its EP16/32/64 internode figures (43, 58, 51 GB/s;
# deepseek-ai/DeepEP docs/legacy.md, moe.md 7): 43/50 = 0.86.
FLEX_NIC_EFFICIENCY = 0.86


def dispatcher_is(c, *names: str) -> np.ndarray:
    """Where the candidates' token dispatcher (layout axis moe_dispatcher, a choice code; or one
    Layout's name) is one of ``names``. Bool array."""
    value = np.asarray(c.moe_dispatcher)
    if value.dtype.kind in "UO":
        return np.isin(value, names)
    return np.isin(value, [MOE_DISPATCHERS.index(n) for n in names])


def expert_collectives(model: ModelSpec, training: TrainingSpec, c, elem: Elements, full) -> list[Collective]:
    """The expert-parallel collectives of ONE MoE block for ONE micro-batch on one GPU (see the
    module docstring): calls and payloads as arrays; groups ``ep`` and ``etp`` (zero calls where
    the group has one rank, or where the candidate's dispatcher does not make the call: the
    all-to-all ones for alltoall / deepep / hybridep, the all-gather ones for allgather)."""
    rows = moe_rows(model, c, training)
    h, act = model.hidden_size, elem.act
    a2a = 1.0 - dispatcher_is(c, "allgather")
    on_ep = (np.asarray(c.ep) > 1) * a2a
    on_etp = (np.asarray(c.etp) > 1) * a2a
    etp = np.asarray(c.etp, dtype=np.float64)
    again = np.where(full, 1.0, 0.0)
    sent = rows["sent"]
    out = []
    for phase, n in (("forward", 1.0), ("recompute", again)):
        out += [Collective("ep", "all_to_all", "layer", phase, "", on_ep * n, sent * (act * h + PROB_BYTES),
                           "token dispatch (rows and their routing probabilities)"),
                Collective("ep", "all_to_all", "layer", phase, "", on_ep * n, sent * act * h, "token combine"),
                Collective("etp", "all_gather", "layer", phase, "", on_etp * n, etp * sent * (act * h + PROB_BYTES),
                           "expert-TP all-gather of the dispatched rows"),
                Collective("etp", "reduce_scatter", "layer", phase, "", on_etp * n, etp * sent * PROB_BYTES * h,
                           "expert-TP reduce-scatter of the expert outputs (fp32)")]
    out += [Collective("ep", "all_to_all", "layer", "backward", "", on_ep, sent * act * h,
                       "gradient of the token combine"),
            Collective("ep", "all_to_all", "layer", "backward", "", on_ep, sent * (act * h + PROB_BYTES),
                       "gradient of the token dispatch"),
            Collective("etp", "all_gather", "layer", "backward", "", on_etp, etp * sent * PROB_BYTES * h,
                       "expert-TP all-gather of the output gradients (fp32)"),
            Collective("etp", "reduce_scatter", "layer", "backward", "", on_etp, etp * sent * act * h,
                       "expert-TP reduce-scatter of the dispatched rows' gradients")]
    return out + _allgather(model, c, rows, act, again, dispatcher_is(c, "allgather") * 1.0)


def _allgather(model: ModelSpec, c, rows, act: float, again, chosen) -> list[Collective]:
    """The allgather dispatcher (moe.md 4.3) where ``chosen``: over the etp*ep group G, an
    all-gather of the T tokens (h activations), their probabilities and routing map (E fp32 + E
    bool each) and a reduce-scatter of the G*T outputs in the probabilities' dtype; the backward
    mirrors both."""
    E, h = model.moe.num_experts, model.hidden_size
    g = np.asarray(c.etp * c.ep, dtype=np.float64)
    on = (g > 1) * chosen
    T = rows["tokens"]
    gather = g * T * (act * h + PROB_BYTES * E + E)
    scatter = g * T * PROB_BYTES * h
    out = []
    for phase, n in (("forward", 1.0), ("recompute", again)):
        out += [Collective("ep", "all_gather", "layer", phase, "", on * n, gather, "allgather dispatch"),
                Collective("ep", "reduce_scatter", "layer", phase, "", on * n, scatter, "allgather combine (fp32)")]
    return out + [Collective("ep", "all_gather", "layer", "backward", "", on, scatter, "combine gradient"),
                  Collective("ep", "reduce_scatter", "layer", "backward", "", on, g * T * (act * h + PROB_BYTES * E),
                             "dispatch gradient")]


def ep_group(c) -> str:
    """The group kind (layout.groups) one layout's dispatch runs on: ``ep``, ep ranks etp apart
    (alltoall, deepep, hybridep), or ``ep_etp``, the etp*ep ranks of an expert-TP x EP block
    (allgather). Megatron-Core's expert rank order is etp-ep-edp-pp (moe.md 3.1)."""
    return "ep_etp" if bool(np.ravel(dispatcher_is(c, "allgather"))[0]) else "ep"


def dispatch_kind(x: Collective) -> str:
    """The group kind an ``ep`` collective is timed on: the all-to-alls on the ep group, the
    allgather dispatcher's all-gathers and reduce-scatters on the etp*ep block."""
    return "ep" if x.kind == "all_to_all" else "ep_etp"


def miss_probability(num_experts: int, topk: int, held) -> np.ndarray:
    """Probability that a token routed uniformly to ``topk`` distinct of ``num_experts`` experts
    picks none of a set of ``held`` experts: C(E - x, k) / C(E, k) = prod_i (E - x - i)/(E - i),
    i < k (moe.md 4.4). ``held`` broadcast array; float64, 0 where x > E - k."""
    x = np.asarray(held, dtype=np.float64)
    out = np.ones_like(x)
    for i in range(topk):
        out = out * np.maximum(num_experts - x - i, 0.0) / (num_experts - i)
    return out


def flex_shares(model: ModelSpec, n_local, n_nodes) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink share, NIC share) of the all-to-all payload S = T*k rows that Megatron-Core's flex
    dispatcher (DeepEP / HybridEP) moves per rank, for an EP group of ``n_local`` ranks on each
    of ``n_nodes`` NVLink domains, E/n experts per rank (moe.md 4.4, uniform routing):
      over the network one copy per distinct remote domain a token needs,
        D_remote = (n_nodes - 1) * (1 - q(E/n_nodes)), NIC share = D_remote / k;
      over NVLink one copy per distinct rank, the remote ones forwarded inside their domain,
        D_rank = n * (1 - q(E/n)), NVLink share = D_rank * (n_local - 1)/n_local / k,
    q = miss_probability. Inside one domain (n_nodes 1) the NVLink share is D_rank*(n-1)/n/k
    against the all-to-all's (n-1)/n: e.g. DeepSeek-V3 (E 256, k 8) on ep 8, D_rank = 5.29.
    Routing groups (DeepSeek-V3's top-4 of 8 groups, which caps the domains at 4) are not in
    ModelSpec, so D_remote is the uncapped uniform expectation. Broadcast float arrays."""
    E, k = model.moe.num_experts, model.moe.router_topk
    n_local = np.asarray(n_local, dtype=np.float64)
    n_nodes = np.asarray(n_nodes, dtype=np.float64)
    n = n_local * n_nodes
    d_rank = n * (1.0 - miss_probability(E, k, E / n))
    d_remote = (n_nodes - 1.0) * (1.0 - miss_probability(E, k, E / n_nodes))
    return d_rank * (n_local - 1.0) / n_local / k, d_remote / k


def flex_links(links):
    """``links`` with the NIC bandwidth of the fused dispatchers' RDMA transfers (DeepEP,
    HybridEP), FLEX_NIC_EFFICIENCY x the line rate (links.inter_peak; unchanged when that is
    unknown, 0), and their own NVLink bandwidth (Efficiency.a2a_fused_nvlink; else the
    all-to-all's, Links.a2a)."""
    links = links.a2a()
    if links.fused_intra_bw:
        links = replace(links, intra_bw=links.fused_intra_bw)
    if not links.inter_peak:
        return links
    return replace(links, inter_bw=links.inter_peak * FLEX_NIC_EFFICIENCY)
