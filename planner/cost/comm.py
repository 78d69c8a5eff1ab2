"""Time of cost.volumes' collectives where their groups sit, and what overlap hides (formulas.md 5).

Each collective's link time is calls x collective_time(kind, payload) on its group's span
(collectives.group_span: TP ranks 1 apart, CP tp apart, the dp*cp gradient group tp apart,
the tied-embedding pair (pp-1)*tp*cp*dp apart); p2p messages take p2p_time on NVLink or the
network. Exposure (what the step waits for), by the collective's ``overlap``:
- TP: forward and recompute collectives exposed; in backward the input-gradient all-reduce /
  reduce-scatter of QKV and fc1 and the SP re-gathers hide under the window of their GEMMs
  (with SP 2 x, without SP the all-reduce after the dgrad GEMM 1 x the column-parallel forward
  GEMM time: _backward_window), and the output layer's under its weight-gradient GEMM, so
  only their excess shows
  (``training.tp_backward_overlap`` False: the synchronous f/g of Megatron-LM 2019-21, nothing
  hidden); the SP all-gathers of the output gradients are exposed.
- CP ring: each of the cp-1 steps exposes what its transfers take beyond its share of the
  attention of that phase (attention / cp per step).
- DP/ZeRO (``training.overlap_grad_reduce``): per-micro-batch and per-step traffic hides under
  the rank's forward / backward compute of one micro-batch; an implementation-bound ZeRO-3
  (``training.zero3_throughput``) takes at least its received bytes over that rate.
- p2p: blocking send/recv per chunk, 2*vpp transfers per micro-batch (each rank's sends and
  receives pair up), or with Megatron-Core's overlapped interleaved schedule only the fill and
  drain, 2*(pp-1) transfers per step.
Broadcast arrays, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from .collectives import Links, collective_time, p2p_crosses, p2p_time, span
from .compute import LayerTimes
from .memory import rank_index
from .traffic import Collective, Elements
from .volumes import block_collectives, dp_collectives, edge_collectives, p2p_collectives
from . import pipeline
from ..layout import RECOMPUTE_CODES
from .blocks import MOE, routed_factor
from .moe import dispatcher_is, flex_links, flex_shares


class _Timer:
    """Link seconds of collectives on one group span; one collective_time per (kind, payload),
    and each collective timed once however many totals take it."""

    def __init__(self, links: Links, span: tuple, shares: tuple | None = None):
        self.links, self.span, self.shares, self._memo, self._seconds = links, span, shares, {}, {}

    def unit(self, x: Collective) -> np.ndarray:
        key = (x.kind, id(x.payload))
        if key not in self._memo:
            shares = self.shares if x.kind == "all_to_all" else None
            self._memo[key] = (collective_time(x.kind, x.payload, *self.span, self.links, shares), x.payload)
        return self._memo[key][0]

    def __call__(self, x: Collective) -> np.ndarray:
        """calls x the seconds of one call; 0.0 where no candidate makes the call."""
        if id(x) not in self._seconds:
            self._seconds[id(x)] = (x.calls * self.unit(x) if np.count_nonzero(x.calls) else 0.0, x)
        return self._seconds[id(x)][0]

    def total(self, colls, **match) -> np.ndarray:
        """Sum of the link seconds of the collectives whose fields equal ``match``."""
        chosen = [self(x) for x in colls if all(getattr(x, k) == v for k, v in match.items())]
        return sum(chosen) if chosen else 0.0


@dataclass(frozen=True)
class BlockComm:
    """Per block per micro-batch on one GPU: exposed and link seconds of its TP, CP and EP
    collectives (broadcast arrays; 0.0 where the block has none)."""

    tp_exposed: object  # forward + backward, exposed
    tp_recompute: object  # the forward's collectives repeated by full recompute
    tp_link: object = 0.0
    cp_exposed: object = 0.0  # forward + backward + recompute, exposed
    cp_link: object = 0.0
    ep_exposed: object = 0.0  # dispatch and combine forward + backward, exposed
    ep_recompute: object = 0.0  # repeated by full recompute
    ep_link: object = 0.0


def block_comm(model: ModelSpec, training: TrainingSpec, c, links: Links,
               times: dict[str, LayerTimes], elem: Elements, link: bool = True,
               sm_count: int | None = None) -> dict[str, BlockComm]:
    """Time of volumes.block_collectives, per block kind: TP on the tp group (the backward's
    hidden collectives under 2 x the block's column-parallel GEMM time; with TP communication
    overlap as _tp_overlapped, on a GPU of ``sm_count`` SMs), the CP ring between CP
    neighbours, the expert dispatch on the EP group (ep ranks etp apart) and the expert-TP
    group (etp ranks), all-to-all and expert-TP times scaled by training.moe_imbalance (the busiest rank
    receives that much more, moe.md 4.2). ``link`` False: without the TP link seconds (no
    step time needs them). {kind: BlockComm}"""
    tp = _Timer(links, span(c, "tp", links.domain))
    overlap = np.asarray(c.tp_comm_overlap, dtype=bool)
    out = {}
    for kind, colls in block_collectives(model, training, c, elem).items():
        layer = times[kind]
        tps = [x for x in colls if x.group == "tp"]
        hidden = tp.total(tps, phase="backward", overlap="wgrad")
        window = _backward_window(training, c, layer)
        exposed = tp.total(tps, phase="forward") + tp.total(tps, phase="backward", overlap="") \
            + np.maximum(0.0, hidden - window)
        parts = dict(tp_exposed=exposed, tp_recompute=tp.total(tps, phase="recompute"))
        if np.any(overlap) and kind != MOE:  # userbuffers cover no expert linear
            f, r, b = _tp_overlapped(tp, tps, layer, sm_count)
            parts = dict(tp_exposed=np.where(overlap, f + b + np.maximum(0.0, hidden - window), exposed),
                         tp_recompute=np.where(overlap, r, parts["tp_recompute"]))
        if link:
            parts["tp_link"] = tp.total(tps)
        if any(x.group == "cp" for x in colls):
            parts["cp_exposed"], parts["cp_link"] = ring_times(c, colls, links, layer)
        if any(x.group in ("ep", "etp") for x in colls):
            parts.update(_expert_times(model, training, c, links, colls, times))
        out[kind] = BlockComm(**parts)
    return out


# Transformer Engine's userbuffers defaults (TE v2.9-v2.16 pytorch/module/base.py L271-328):
# the row-parallel forward GEMM's reduce-scatter pipelined in 4 chunks on 16 SMs the GEMM
# gives up (set_sm_margin: comm_gemm_overlap.cpp L98-100); the all-gathers before the column-
# parallel forward GEMM and the row-parallel input-gradient GEMM by ring exchange on the copy
# engines (1 SM, no margin); the backward's input-gradient reduce-scatter and the input's
# re-gather in bulk beside the column-parallel dgrad and wgrad GEMMs (the window of
# _backward_window, as without overlap).
TP_OVERLAP_CHUNKS = 4
TP_OVERLAP_SMS = 16


def _tp_overlapped(tp: "_Timer", tps: list, layer: LayerTimes, sm_count: int | None) -> tuple:
    """(forward, recompute, backward-gradient-gather) exposed TP seconds of a block with TP
    communication overlap: each all-gather exposes what it takes beyond the GEMM it feeds
    (the column-parallel forward GEMM; in backward the row-parallel input-gradient GEMM, as
    long as the row-parallel forward one); the pipelined reduce-scatter its last chunk and
    what the rest takes beyond the row-parallel GEMM, plus that GEMM's slowdown on sm_count -
    TP_OVERLAP_SMS SMs; the backward's bulk overlaps slow the column-parallel dgrad and wgrad
    GEMMs alike (TE's default set_sm_margin for both methods). Broadcast arrays."""
    col = layer.column_parallel_share * layer.gemm_forward
    row = layer.gemm_forward - col
    margin = row * TP_OVERLAP_SMS / max((sm_count or 0) - TP_OVERLAP_SMS, 1) if sm_count else 0.0

    def forward(phase: str):
        ag = tp.total(tps, phase=phase, kind="all_gather")
        rs = tp.total(tps, phase=phase, kind="reduce_scatter")
        last = rs / TP_OVERLAP_CHUNKS
        return np.maximum(0.0, ag - col) + last + np.maximum(0.0, rs - last - row) + margin * (rs > 0)

    gather = tp.total(tps, phase="backward", overlap="", kind="all_gather")
    # the bulk overlaps beside the column-parallel dgrad and wgrad GEMMs take the same SMs
    bulk = 2.0 * col * TP_OVERLAP_SMS / max((sm_count or 0) - TP_OVERLAP_SMS, 1) if sm_count else 0.0
    bulk = bulk * (tp.total(tps, phase="backward", overlap="wgrad") > 0)
    return forward("forward"), forward("recompute"), np.maximum(0.0, gather - row) + bulk


def _backward_window(training: TrainingSpec, c, layer: LayerTimes):
    """Seconds of GEMM that the backward input-gradient TP collectives of a block hide under,
    per layer per micro-batch (Megatron / Transformer Engine linear backward): with sequence
    parallelism two collectives (the input gradient's reduce-scatter and the input's
    re-gather), each under its own GEMM of QKV / fc1, dgrad and wgrad: 2 x the column-parallel
    GEMM time; without it one all-reduce that starts only when the dgrad GEMM has produced its
    input, so it hides under the wgrad GEMM alone: 1 x. 0 with the synchronous f/g of
    2019-21 Megatron (training.tp_backward_overlap False). Broadcast array."""
    if not training.tp_backward_overlap:
        return 0.0
    return np.where(c.sequence_parallel, 2.0, 1.0) * layer.column_parallel_share * layer.gemm_forward


def _expert_times(model: ModelSpec, training: TrainingSpec, c, links: Links, colls: list[Collective],
                  times: dict) -> dict:
    """Exposed, recompute and link seconds of an MoE block's dispatch and combine, each
    candidate with its own dispatcher (layout axis moe_dispatcher): NCCL's all-to-all on the ep
    group (ep ranks etp apart) at the all-to-all's bandwidths (Links.a2a), the fused dispatchers
    (deepep, hybridep) with the deduplicated NVLink and NIC shares of moe.flex_shares at the
    RDMA rate DeepEP measures (moe.flex_links), the allgather dispatcher on the etp*ep block;
    the expert-TP group's collectives on etp ranks; the routed ones scaled by
    blocks.routed_factor. Exposed in full, or with Megatron-Core's EP overlap (layout axis
    moe_a2a_overlap, where a2a_overlap_applies) only what exceeds the compute of one MoE layer
    (its attention and MoE blocks, forward and backward), the other micro-batch's work that
    the combined 1F1B schedule runs beside it (pipeline_parallel/combined_1f1b.py)."""
    ep_span = span(c, "ep", links.domain)
    flex = dispatcher_is(c, "deepep", "hybridep")
    timers = {"ep": _Timer(links.a2a(), ep_span), "ep_etp": _Timer(links, span(c, "ep_etp", links.domain)),
              "etp": _Timer(links, span(c, "etp", links.domain))}
    if np.any(flex):
        timers["flex"] = _Timer(flex_links(links), ep_span, flex_shares(model, *ep_span))
    gamma = routed_factor(training)

    def seconds(x: Collective):
        if x.group == "etp":
            t = timers["etp"](x)
        elif x.kind == "all_to_all":
            t = np.where(flex, timers["flex"](x), timers["ep"](x)) if "flex" in timers else timers["ep"](x)
        else:
            t = timers["ep_etp"](x)
        return t * (gamma if _routed(x) else 1.0)

    def total(phase: str):
        return sum((seconds(x) for x in colls if x.group in ("ep", "etp") and x.phase == phase), 0.0)
    forward_backward = total("forward") + total("backward")
    recompute = total("recompute")
    layer = times["attention"].forward + times["attention"].backward + \
        times["moe"].forward + times["moe"].backward
    exposed = np.where(a2a_overlap_on(c), np.maximum(0.0, forward_backward - layer), forward_backward)
    return {"ep_exposed": exposed, "ep_recompute": recompute, "ep_link": forward_backward + recompute}


def _routed(x: Collective) -> bool:
    """Whether a collective carries the routed rows, whose busiest rank holds routed_factor
    times the balanced share: the all-to-all dispatchers' all-to-alls and the expert-TP
    collectives of the rows each rank received (moe.md 4.2); the allgather dispatcher's
    collectives move every token, balanced."""
    return x.kind == "all_to_all" or x.group == "etp"


def a2a_overlap_applies(c) -> np.ndarray:
    """Where Megatron-Core's EP communication overlap (--overlap-moe-expert-parallel-comm) can
    run: ep > 1, no full recomputation, and the interleaved schedule when pp > 1 (its combined
    1F1B pairs one micro-batch's forward with another's backward; moe.md 3.2, Megatron-LM
    transformer_config.py L3003-3050). Bool array over the candidates ``c``: arrays with the
    recompute codes of layout.RECOMPUTE_CODES (Candidates), or one Layout (its mode by name)."""
    recompute = np.asarray(c.recompute)
    if recompute.dtype.kind in "UO":  # a Layout: the mode by name
        recompute = np.vectorize(RECOMPUTE_CODES.__getitem__)(recompute)
    return (np.asarray(c.ep) > 1) & (recompute != RECOMPUTE_CODES["full"]) & \
        ((np.asarray(c.pp) == 1) | (np.asarray(c.vpp) > 1))


def a2a_overlap_on(c) -> np.ndarray:
    """Where the candidates run the EP overlap: the layout axis moe_a2a_overlap set where it
    applies (a2a_overlap_applies; the framework rules refuse it elsewhere). Bool array."""
    return np.asarray(c.moe_a2a_overlap, dtype=bool) & a2a_overlap_applies(c)


def a2a_overlap_note(training, c, index: int = 0) -> str | None:
    """A note when candidate ``index`` of ``c`` names a fused or all-gather token dispatcher and
    has no expert group for it to move tokens over (ep = etp = 1: each GPU holds every
    expert)."""
    group = np.asarray(c.ep * c.etp).reshape(-1)[index]
    name = c.layout(index).moe_dispatcher if hasattr(c, "layout") else c.moe_dispatcher
    if name != "alltoall" and group == 1:
        return (f"the {name} token dispatcher has nothing to move on this layout (ep = etp = 1: "
                "every GPU holds every expert)")
    return None


def ring_times(c, colls: list[Collective], links: Links, layer: LayerTimes) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, link) seconds of the CP ring's sends (``colls``: layer_collectives) per layer per
    micro-batch; ``layer`` gives the attention times they hide under. Each of the
    cp-1 steps of a phase exposes max(0, its transfers - attention of the phase / cp); a
    receive is the other end of a send and is not timed again."""
    cp = np.asarray(c.cp, dtype=np.float64)
    steps = np.maximum(cp - 1, 1.0)
    crosses = span(c, "cp", links.domain)[1] > 1
    attention = {"forward": layer.attention_forward, "recompute": layer.attention_forward,
                 "backward": layer.attention_backward}
    exposed, link = 0.0, 0.0
    for x in colls:
        if x.group != "cp" or x.kind != "send":
            continue
        per_step = x.calls / steps * p2p_time(x.payload, crosses, links)
        exposed = exposed + (cp > 1) * steps * np.maximum(0.0, per_step - attention[x.phase] / cp)
        link = link + (cp > 1) * steps * per_step
    return exposed, link


@dataclass(frozen=True)
class RankComm:
    """Seconds of one pipeline rank kind's collectives beyond its layers (broadcast arrays)."""

    is_last: np.ndarray  # runs the output layer and the loss (pipeline.runs_loss)
    blocks: dict  # the rank's blocks: {kind: count} (blocks.rank_blocks)
    edge_tp: np.ndarray  # per micro-batch: embedding, output layer, cross entropy (exposed)
    p2p_per_microbatch: np.ndarray  # blocking p2p, per micro-batch
    p2p_fill: np.ndarray  # overlapped interleaved p2p: fill and drain, once per step
    dp_per_microbatch: np.ndarray  # exposed ZeRO-2/3 traffic per micro-batch
    dp_step_exposed: np.ndarray  # exposed once-per-step DP/ZeRO and tied-embedding traffic
    norm_exposed: np.ndarray  # the SP norm-gradient all-reduce, once per step
    links: dict  # link seconds: edge_tp, norm (tp); p2p (pp, per micro-batch); dp_mb, dp_step

    def link_per_step(self, group: str, comms: dict, m) -> np.ndarray:
        """Link seconds of ``group`` (tp, cp, ep, pp, dp) on this rank in one step; ``comms``:
        block_comm's {kind: BlockComm}."""
        lk = self.links
        if group in ("tp", "cp", "ep"):
            per_mb = sum(self.blocks[k] * getattr(comms[k], f"{group}_link") for k in self.blocks)
            if group == "tp":
                return m * (per_mb + lk["edge_tp"]) + lk["norm"]
            return m * per_mb
        return {"pp": m * lk["p2p"], "dp": m * lk["dp_mb"] + lk["dp_step"]}[group]


def rank_comm(model: ModelSpec, training: TrainingSpec, c, links: Links, times: dict,
              elem: Elements, kind: str, counts: dict, output_gemm, link: bool = True) -> RankComm:
    """Time of the edge, p2p, DP/ZeRO, norm and tied-embedding collectives of a rank kind
    (memory.rank_index) holding ``counts`` blocks (blocks.rank_blocks; ``times``: their
    compute.block_times, the forward and backward that DP/ZeRO traffic hides under);
    ``output_gemm`` (compute.output_gemm_time) is the weight-gradient GEMM the output layer's
    backward TP collective hides under. ``link`` False: no link seconds (RankComm.links {})."""
    rank = rank_index(c, kind)
    tp = _Timer(links, span(c, "tp", links.domain))
    edges = edge_collectives(model, training, c, rank, elem)
    dp_colls = dp_collectives(model, training, c, rank, elem)
    norm = [x for x in dp_colls if x.group == "tp"]
    window = output_gemm if training.tp_backward_overlap else 0.0
    edge_tp = tp.total(edges, overlap="") + np.maximum(0.0, tp.total(edges, overlap="wgrad") - window)
    norm_t = tp.total(norm)
    p2p = p2p_collectives(model, training, c, rank, elem)[0]  # the sends
    t_p2p = p2p_time(p2p.payload, p2p_crosses(c.stage_gpus, c.pp, links.domain), links)
    on = np.asarray(c.pp) > 1
    overlapped = (np.asarray(c.vpp) > 1) & training.overlap_p2p_comm
    per_mb = np.where(on & ~overlapped, 2 * np.asarray(c.vpp) * t_p2p, 0.0)
    fill = np.where(on & overlapped, 2 * (np.asarray(c.pp) - 1) * t_p2p, 0.0)
    dp = _dp_times(training, c, links, [x for x in dp_colls if x.group in ("dp", "edp")])
    tied = _Timer(links, span(c, "embd", links.domain))
    tied_t = tied.total([x for x in dp_colls if x.group == "embd"])
    window_f = sum(counts[k] * times[k].forward for k in counts)
    window_b = sum(counts[k] * times[k].backward for k in counts)
    if training.overlap_grad_reduce:
        mb = np.maximum(0.0, dp["microbatch", "forward"] - window_f) + \
            np.maximum(0.0, dp["microbatch", "backward"] - window_b)
        step = np.maximum(0.0, dp["step", "backward"] - window_b) + \
            np.maximum(0.0, dp["step", "forward"] - window_f)
    else:
        mb = dp["microbatch", "forward"] + dp["microbatch", "backward"]
        step = dp["step", "forward"] + dp["step", "backward"]
    links_out = {"edge_tp": tp.total(edges), "norm": norm_t, "p2p": p2p.calls * t_p2p,
                 "dp_mb": dp["microbatch", "forward"] + dp["microbatch", "backward"],
                 "dp_step": dp["step", "forward"] + dp["step", "backward"] + tied_t} if link else {}
    return RankComm(pipeline.runs_loss(c, rank), counts, edge_tp, per_mb, fill, mb,
                    step + tied_t, norm_t, links_out)


def _dp_times(training: TrainingSpec, c, links: Links, colls: list[Collective]) -> dict:
    """Link seconds of the DP/ZeRO collectives by (per, phase), on the dp*cp group (ranks tp
    apart) for dense parameters and the edp group (ranks etp*ep apart) for experts. With ``training.zero3_throughput`` (an implementation-bound ZeRO-3, TrainingSpec)
    a ZeRO-3 collective takes at least the bytes each GPU receives, (n-1)/n of its payload,
    over that rate."""
    kinds = {"dp": "dp_cp", "edp": "edp"}  # the volumes' group -> layout.groups' kind
    timers = {g: _Timer(links, span(c, kind, links.domain)) for g, kind in kinds.items()
              if any(x.group == g for x in colls)}
    sizes = {"dp": c.grad_group, "edp": c.edp}
    out = {(per, phase): 0.0 for per in ("microbatch", "step") for phase in ("forward", "backward")}
    for x in colls:
        t = timers[x.group](x)
        n = np.asarray(sizes[x.group], dtype=np.float64)
        if training.zero3_throughput is not None and x.what.startswith("ZeRO-3"):
            t = np.maximum(t, x.calls * x.payload * (n - 1) / n / training.zero3_throughput)
        out[x.per, x.phase] = out[x.per, x.phase] + t
    return out
