"""The mixture-of-experts side of a validation run (no torch here): the miniature's experts and
expert grid, and what the cost model predicts for them.

Miniature (``moe_miniature``): ep' = min(ep, 2), etp' = min(etp, 2) folded over the
miniature's tp'*cp'*dp' ranks (etp' drops to 1 first, then ep', if they do not fit, with a
note), 4 experts of width h/2, top-k min(k, 2), one shared expert of the same width if the
model has shared experts, one leading dense layer if it has dense layers, every later layer
MoE. What the validator's decoder does not run is mapped and listed: MLA runs as MHA, MTP
modules, QK norms and attention sinks are left out, full recompute runs as none (a
checkpoint's early stop would cut the recomputed MoE layer at a routing-dependent point),
ZeRO-2/3 as ZeRO-1 (expert parameters are not FSDP-wrapped), SP is on wherever tp' > 1
(Megatron-Core's MoE layer requires it).

Prediction: parameters per rank (``rank_params``: dense ones TP-sharded as the dense layers,
the router replicated, the experts E*P_e/(ep*etp)); the volumes of the dense collectives from
validate.torch_volumes.step_volumes on the model without its experts, corrected for the MoE layers
(``base_volumes``); the expert collectives per rank from the routing each rank recorded
(``routed_volumes``, cost.moe_dispatch.moe_dispatch_volumes impl "torch").
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..cost import model_counts
from ..cost.moe_dispatch import moe_dispatch_volumes
from .torch_volumes import step_volumes
from ..model_schema import MoESpec
from ..cost import blocks, memory
from ..layout import Candidates


def moe_degrees(lay, stage: int, bias: bool) -> tuple[int, int, list[dict]]:
    """(ep', etp', not exercised) on a miniature stage of ``stage`` ranks."""
    ep, etp = min(lay.ep, 2), min(lay.etp, 2)
    dropped = []
    if etp > 1 and (bias or stage % (ep * etp)):
        etp = 1
        dropped.append({"feature": "etp", "reason": (
            "etp' = 1: " + ("Megatron-Core allows biases in MoE layers only with etp 1" if bias
                            else f"ep'*etp' does not fold into the miniature's {stage} ranks"))})
    if stage % ep:
        ep = 1
        dropped.append({"feature": "ep", "reason": f"ep' = 1: ep does not fold into {stage} ranks"})
    return ep, etp, dropped


def moe_miniature(m, hidden: int) -> tuple[dict, list[dict]]:
    """The model updates of an MoE miniature and what it leaves out ({"feature", "reason"})."""
    moe = m.moe
    dense = moe.first_dense_layers > 0 or moe.layer_freq > 1
    spec = MoESpec(num_experts=4, router_topk=min(moe.router_topk, 2), ffn_hidden_size=hidden // 2,
                   shared_experts=1 if moe.shared_experts else 0,
                   first_dense_layers=1 if dense else 0)
    update = dict(moe=spec, attention_type=None, mla=None, mtp_layers=0, qk_norm="none",
                  attention_sinks=False, sliding_window=None, window_layers=None)
    left = [("MLA", m.attention_kind == "mla", "run as multi-head attention (the validator's "
             "decoder has no MLA)"),
            ("MTP", m.mtp_layers > 0, f"{m.mtp_layers} MTP module(s) left out"),
            ("QK norm", m.qk_norm != "none", "left out"),
            ("attention sinks", m.attention_sinks, "left out"),
            ("sliding window", m.sliding_window is not None, "full causal attention")]
    return update, [{"feature": f, "reason": r} for f, on, r in left if on]


def _rank_layer_ids(run, pp_rank: int) -> list[int]:
    lay, n = run.layout, run.model.num_layers
    stages = lay.pp * lay.vpp
    counts = run.stage_layers() or [n // stages] * stages
    starts = np.cumsum([0] + counts)
    ids = []
    for k in range(lay.vpp):
        sid = pp_rank + k * lay.pp
        ids += list(range(starts[sid], starts[sid] + counts[sid]))
    return ids


def rank_params(run, pp_rank: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one GPU of pipeline rank ``pp_rank``.

    Per block the cost model's counts (blocks.block_params: attention, dense MLP, MoE block with
    router and shared experts, routed experts E*P_e/(ep*etp)) over the rank's own decoder layers
    (its interleaved chunks, exactly), + embedding / head (memory.rank_params). Where the
    miniature's modules hold more than the cost model counts, added here: Q/K/V biases with
    ``qkv_bias`` (block_params counts biases only with ``bias``), the shared experts' and the
    routed experts' fc2 bias h, not sharded over TP / ETP."""
    m, lay = run.model, run.layout
    c = Candidates.from_layouts([lay])
    per = {k: (float(np.sum(v[0])), float(np.sum(v[1])), float(np.sum(v[2])))
           for k, v in blocks.block_params(m, c).items()}
    h, tp, bias = m.hidden_size, lay.tp, m.bias
    attention = per[blocks.ATTENTION][0] + per[blocks.ATTENTION][1]
    if m.qkv_bias:
        attention += m.kv_channels * (m.num_attention_heads / tp + 2 * float(blocks.kv_heads_per_rank(m, tp)))
    ids = _rank_layer_ids(run, pp_rank)
    n_moe = int(sum(model_counts.moe_layer_mask(m)[ids]))
    mlp = per[blocks.MLP][0] + per[blocks.MLP][1] if blocks.MLP in per else 0.0
    moe = per[blocks.MOE][0] + per[blocks.MOE][1]
    if bias and m.moe.shared_experts:
        moe += h * (1 - 1 / tp)
    edges = memory.rank_params(m, c, pp_rank)
    dense = len(ids) * attention + (len(ids) - n_moe) * mlp + n_moe * moe \
        + float(edges["embedding"][0]) + float(edges["head"][0])
    experts = per[blocks.MOE][2] + (m.moe.num_experts * h * (1 - 1 / lay.etp) / lay.ep if bias else 0.0)
    return dense, n_moe * experts


def _pad(n: float, k: int) -> float:
    return -(-n // k) * k


def base_volumes(run, pp_rank: int, elem: int) -> dict[str, list[int]]:
    """Per-step {"group:kind": [calls, bytes]} of every collective but the token dispatch, for
    one GPU of pipeline rank ``pp_rank`` of an MoE run (module docstring)."""
    m, lay, tr = run.model, run.layout, run.training
    twin = m.model_copy(update=dict(moe=None))
    vols = {f"{g}:{k}": [c, b] for (g, k), (c, b) in step_volumes(
        twin, tr, lay, pp_rank, impl="torch", act_bytes=elem, weight_bytes=elem,
        grad_bytes=elem).items()}
    ids = _rank_layer_ids(run, pp_rank)
    n_moe = int(sum(model_counts.moe_layer_mask(m)[ids]))
    micro = int(lay.num_microbatches(tr.global_batch_size))
    x = int(lay.tokens_per_microbatch(tr.seq_length)) * m.hidden_size * elem
    if lay.tp > 1 and n_moe:
        if not m.moe.shared_experts:  # no TP-sharded MLP: its SP gather / scatter, both passes
            for kind in ("all_gather", "reduce_scatter"):
                vols[f"tp:{kind}"][0] -= 2 * n_moe * micro
                vols[f"tp:{kind}"][1] -= 2 * n_moe * micro * x
        ar = vols.setdefault("tp:all_reduce", [0, 0])  # router gradients, one per tensor
        E = m.moe.num_experts
        ar[0] += n_moe * (2 if m.bias else 1)
        ar[1] += n_moe * (E * m.hidden_size + (E if m.bias else 0)) * elem
    dense, expert = rank_params(run, pp_rank)
    for key in [k for k in vols if k.startswith("dp:")]:
        vols[key][1] = int(vols[key][0] * _pad(dense, lay.grad_group) * elem)
    if expert and lay.edp > 1:
        kinds = ("all_reduce",) if lay.zero_stage == 0 else ("reduce_scatter", "all_gather")
        for kind in kinds:
            vols[f"edp:{kind}"] = [1, int(_pad(expert, lay.edp) * elem)]
    return {k: [int(c), int(b)] for k, (c, b) in vols.items() if c}


def memory_bytes(run, pp_rank: int) -> dict[str, float]:
    """Parameter, gradient and optimizer bytes of one GPU (flat master + Adam m, v of the dense
    buffer over dp*cp and the expert buffer over edp, each padded as planner.validate pads it)."""
    lay, e = run.layout, run.elem
    dense, expert = rank_params(run, pp_rank)
    n, ne = lay.grad_group, lay.edp
    opt = _pad(dense, n) / (n if lay.zero_stage else 1)
    if expert:
        opt += _pad(expert, ne) / (ne if lay.zero_stage else 1)
    return {"params_bytes": (dense + expert) * e, "grads_bytes": (dense + expert) * e,
            "optimizer_bytes": 3 * e * opt}


def routed_volumes(run, records: list[dict]) -> dict[int, dict[str, list[int]]]:
    """{rank: {"group:kind": [calls, bytes]}} of the token dispatch in the last step, from the
    per-expert counts every rank recorded (each tp_ep group's ranks run the same MoE forwards
    in the same order)."""
    lay = run.layout
    groups = defaultdict(dict)
    for r in records:
        c = r["coord"]
        if "ep" in c:
            groups[(c["pp"], c["edp"])][(c["etp"], c["ep"])] = r
    out: dict[int, dict[str, list[int]]] = {}
    for members in groups.values():
        ranks = [members[(t, p)] for t in range(lay.etp) for p in range(lay.ep)]
        steps = [r["moe_counts"][-1] for r in ranks]
        total: dict[str, np.ndarray] = {}
        for layer in range(len(steps[0])):
            for call in range(len(steps[0][layer])):
                counts = np.array([s[layer][call] for s in steps]).reshape(lay.etp, lay.ep, -1)
                for (g, k), (calls, nbytes) in moe_dispatch_volumes(
                        counts, run.model.hidden_size, run.elem, impl="torch").items():
                    for name, v in ((f"{g}:{k}", calls), (f"{g}:{k}#bytes", nbytes)):
                        total[name] = total.get(name, 0) + v
        for (t, p), r in members.items():
            out[r["rank"]] = {k: [int(total[k][t, p]), int(total[k + "#bytes"][t, p])]
                              for k in total if not k.endswith("#bytes") and total[k][t, p]}
    return out
