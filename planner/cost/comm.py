"""Time of cost.volumes' collectives where their groups sit, and what overlap hides (formulas.md 5).

Each collective's link time is calls x collective_time(kind, payload) on its group's span
(collectives.group_span: TP ranks 1 apart, CP tp apart, the dp*cp gradient group tp apart,
the tied-embedding pair (pp-1)*tp*cp*dp apart); p2p messages take p2p_time on NVLink or the
network. Exposure (what the step waits for), by the collective's ``overlap``:
- TP: forward and recompute collectives exposed; in backward the input-gradient all-reduce /
  reduce-scatter of QKV and fc1 and the SP re-gathers hide under the window of their GEMMs,
  2 x (column-parallel share) x forward GEMM time, and the output layer's under its
  weight-gradient GEMM, so only their excess shows
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
from .collectives import Links, collective_time, group_span, p2p_crosses, p2p_time
from .compute import LayerTimes
from .memory import rank_index
from .volumes import (Collective, Elements, dp_collectives, edge_collectives, layer_collectives,
                      p2p_collectives)


class _Timer:
    """Link seconds of collectives on one group span; one collective_time per (kind, payload)."""

    def __init__(self, links: Links, span: tuple):
        self.links, self.span, self._memo = links, span, {}

    def unit(self, x: Collective) -> np.ndarray:
        key = (x.kind, id(x.payload))
        if key not in self._memo:
            self._memo[key] = (collective_time(x.kind, x.payload, *self.span, self.links), x.payload)
        return self._memo[key][0]

    def __call__(self, x: Collective) -> np.ndarray:
        return x.calls * self.unit(x)

    def total(self, colls, **match) -> np.ndarray:
        """Sum of the link seconds of the collectives whose fields equal ``match``."""
        chosen = [self(x) for x in colls if all(getattr(x, k) == v for k, v in match.items())]
        return sum(chosen) if chosen else 0.0


@dataclass(frozen=True)
class LayerComm:
    """Per layer per micro-batch on one GPU: exposed and link seconds of TP and CP."""

    tp_exposed: np.ndarray  # forward + backward, exposed
    tp_recompute: np.ndarray  # the forward's collectives repeated by full recompute
    tp_link: np.ndarray
    cp_exposed: np.ndarray  # forward + backward + recompute, exposed
    cp_link: np.ndarray


def layer_comm(model: ModelSpec, training: TrainingSpec, c, links: Links, layer: LayerTimes,
               elem: Elements) -> LayerComm:
    """Time of layer_collectives: TP on the tp group, the CP ring between CP neighbours."""
    colls = layer_collectives(model, training, c, elem)
    tp = [x for x in colls if x.group == "tp"]
    timer = _Timer(links, group_span(c.tp, 1, links.domain))
    hidden = timer.total(tp, phase="backward", overlap="wgrad")
    window = 2 * layer.column_parallel_share * layer.gemm_forward if training.tp_backward_overlap else 0.0
    exposed = timer.total(tp, phase="forward") + timer.total(tp, phase="backward", overlap="") \
        + np.maximum(0.0, hidden - window)
    recompute = timer.total(tp, phase="recompute")
    cp_exposed, cp_link = ring_times(c, colls, links, layer)
    return LayerComm(exposed, recompute, timer.total(tp), cp_exposed, cp_link)


def ring_times(c, colls: list[Collective], links: Links, layer: LayerTimes) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, link) seconds of the CP ring's sends (``colls``: layer_collectives) per layer per
    micro-batch; ``layer`` gives the attention times they hide under. Each of the
    cp-1 steps of a phase exposes max(0, its transfers - attention of the phase / cp); a
    receive is the other end of a send and is not timed again."""
    cp = np.asarray(c.cp, dtype=np.float64)
    steps = np.maximum(cp - 1, 1.0)
    crosses = group_span(c.cp, c.tp, links.domain)[1] > 1
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

    is_last: np.ndarray
    layers: np.ndarray
    edge_tp: np.ndarray  # per micro-batch: embedding, output layer, cross entropy (exposed)
    p2p_per_microbatch: np.ndarray  # blocking p2p, per micro-batch
    p2p_fill: np.ndarray  # overlapped interleaved p2p: fill and drain, once per step
    dp_per_microbatch: np.ndarray  # exposed ZeRO-2/3 traffic per micro-batch
    dp_step_exposed: np.ndarray  # exposed once-per-step DP/ZeRO and tied-embedding traffic
    norm_exposed: np.ndarray  # the SP norm-gradient all-reduce, once per step
    links: dict  # link seconds: edge_tp, norm (tp); p2p (pp, per micro-batch); dp_mb, dp_step

    def link_per_step(self, group: str, layer: LayerComm, m) -> np.ndarray:
        """Link seconds of ``group`` (tp, cp, pp, dp) on this rank in one step."""
        lk = self.links
        return {"tp": m * (self.layers * layer.tp_link + lk["edge_tp"]) + lk["norm"],
                "cp": m * self.layers * layer.cp_link,
                "pp": m * lk["p2p"],
                "dp": m * lk["dp_mb"] + lk["dp_step"]}[group]


def rank_comm(model: ModelSpec, training: TrainingSpec, c, links: Links, layer: LayerTimes,
              elem: Elements, kind: str, n_layers, output_gemm) -> RankComm:
    """Time of the edge, p2p, DP/ZeRO, norm and tied-embedding collectives of a rank kind
    (memory.rank_index) holding ``n_layers`` layers; ``output_gemm`` (compute.output_gemm_time)
    is the weight-gradient GEMM the output layer's backward TP collective hides under."""
    rank = rank_index(c, kind)
    tp = _Timer(links, group_span(c.tp, 1, links.domain))
    edges = edge_collectives(model, training, c, rank, elem)
    dp_colls = dp_collectives(model, training, c, rank, elem)
    norm = [x for x in dp_colls if x.group == "tp"]
    window = output_gemm if training.tp_backward_overlap else 0.0
    edge_tp = tp.total(edges, overlap="") + np.maximum(0.0, tp.total(edges, overlap="wgrad") - window)
    edge_link, norm_t = tp.total(edges), tp.total(norm)
    p2p = p2p_collectives(model, training, c, rank, elem)[0]  # the sends
    t_p2p = p2p_time(p2p.payload, p2p_crosses(c.stage_gpus, c.pp, links.domain), links)
    on = np.asarray(c.pp) > 1
    overlapped = (np.asarray(c.vpp) > 1) & training.overlap_p2p_comm
    per_mb = np.where(on & ~overlapped, 2 * np.asarray(c.vpp) * t_p2p, 0.0)
    fill = np.where(on & overlapped, 2 * (np.asarray(c.pp) - 1) * t_p2p, 0.0)
    dp = _dp_times(training, c, links, [x for x in dp_colls if x.group == "dp"])
    tied = _Timer(links, group_span(2, (np.asarray(c.pp) - 1) * c.stage_gpus, links.domain))
    tied_t = tied.total([x for x in dp_colls if x.group == "embd"])
    window_f, window_b = n_layers * layer.forward, n_layers * layer.backward
    if training.overlap_grad_reduce:
        mb = np.maximum(0.0, dp["microbatch", "forward"] - window_f) + \
            np.maximum(0.0, dp["microbatch", "backward"] - window_b)
        step = np.maximum(0.0, dp["step", "backward"] - window_b) + \
            np.maximum(0.0, dp["step", "forward"] - window_f)
    else:
        mb = dp["microbatch", "forward"] + dp["microbatch", "backward"]
        step = dp["step", "forward"] + dp["step", "backward"]
    links_out = {"edge_tp": edge_link, "norm": norm_t, "p2p": p2p.calls * t_p2p,
                 "dp_mb": dp["microbatch", "forward"] + dp["microbatch", "backward"],
                 "dp_step": dp["step", "forward"] + dp["step", "backward"] + tied_t}
    return RankComm(rank == np.asarray(c.pp) - 1, n_layers, edge_tp, per_mb, fill, mb,
                    step + tied_t, norm_t, links_out)


def _dp_times(training: TrainingSpec, c, links: Links, colls: list[Collective]) -> dict:
    """Link seconds of the DP/ZeRO collectives by (per, phase), on the dp*cp group (ranks tp
    apart). With ``training.zero3_throughput`` (an implementation-bound ZeRO-3, TrainingSpec)
    a ZeRO-3 collective takes at least the bytes each GPU receives, (n-1)/n of its payload,
    over that rate."""
    n = np.asarray(c.grad_group, dtype=np.float64)
    timer = _Timer(links, group_span(c.grad_group, c.tp, links.domain))
    out = {(per, phase): 0.0 for per in ("microbatch", "step") for phase in ("forward", "backward")}
    for x in colls:
        t = timer(x)
        if training.zero3_throughput is not None and x.what.startswith("ZeRO-3"):
            t = np.maximum(t, x.calls * x.payload * (n - 1) / n / training.zero3_throughput)
        out[x.per, x.phase] = out[x.per, x.phase] + t
    return out
