"""A mixture-of-experts MLP with expert parallelism (EP) and expert tensor parallelism (ETP) on
torch.distributed (validator only; imports torch).

Routing: router logits (no bias unless the model has biases), top-k, softmax over the k chosen
(Megatron-Core's default, moe_router_pre_softmax false); dropless. The token copies are sorted by
expert, sent over the EP group with one all-to-all (the receive sizes come from an all-gather of
every rank's per-expert counts over the ETP x EP group), all-gathered over the ETP group (padded
to the largest peer: gloo has no uneven all-gather), run through this rank's shard of its
E/ep experts, reduce-scattered over ETP, returned with a second all-to-all, weighted and summed
per token on the source rank. Backward mirrors each collective (cost.moe_dispatch, impl
"torch"). An optional shared expert (a dense MLP) is added; its TP sharding is the parallelizer's.
Every forward appends this rank's per-expert counts to ``records`` ([int] of length E).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..layout import groups
from .mlp import MLP


@dataclass
class ExpertComm:
    """This rank's place in the expert grid: groups and coordinates (etp rank t, ep rank p)."""

    ep_group: object
    etp_group: object
    tp_ep_group: object
    ep: int
    etp: int
    ep_rank: int
    etp_rank: int


class AllToAll(torch.autograd.Function):
    """Rows to the ranks of ``group`` by ``in_splits``; backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class GatherPadded(torch.autograd.Function):
    """(rows, h) padded to ``pad`` rows and all-gathered over ``group`` -> (n*pad, h);
    backward: reduce-scatter, then this rank's rows."""

    @staticmethod
    def forward(ctx, x, pad, group):
        ctx.rows, ctx.pad, ctx.group = x.shape[0], pad, group
        n = dist.get_world_size(group)
        padded = F.pad(x, (0, 0, 0, pad - x.shape[0]))
        out = x.new_empty((n * pad, x.shape[1]))
        dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        shard = grad.new_empty((ctx.pad, grad.shape[1]))
        dist.reduce_scatter_tensor(shard, grad.contiguous(), group=ctx.group)
        return shard[:ctx.rows], None, None


class ScatterPadded(torch.autograd.Function):
    """(n*pad, h) partial sums reduce-scattered over ``group``, this rank's first ``rows``;
    backward: pad and all-gather."""

    @staticmethod
    def forward(ctx, y, rows, group):
        ctx.rows, ctx.group = rows, group
        pad = y.shape[0] // dist.get_world_size(group)
        ctx.pad = pad
        shard = y.new_empty((pad, y.shape[1]))
        dist.reduce_scatter_tensor(shard, y.contiguous(), group=group)
        return shard[:rows]

    @staticmethod
    def backward(ctx, grad):
        padded = F.pad(grad, (0, 0, 0, ctx.pad - grad.shape[0]))
        out = grad.new_empty((dist.get_world_size(ctx.group) * ctx.pad, grad.shape[1]))
        dist.all_gather_into_tensor(out, padded.contiguous(), group=ctx.group)
        return out, None, None


class MoE(nn.Module):
    """Router, E routed experts (stacked weights w1 (E, g, F, h), w2 (E, h, F); g = 2 for SwiGLU's
    gate and up), optional shared expert. ``shard(comm)`` keeps this rank's experts and ETP shard."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        E, Fw, h = cfg.num_experts, cfg.expert_ffn, cfg.hidden
        g = 2 if cfg.activation == "swiglu" else 1
        self.router = nn.Linear(h, E, bias=cfg.bias)
        self.w1 = nn.Parameter(torch.empty(E, g, Fw, h))
        self.w2 = nn.Parameter(torch.empty(E, h, Fw))
        self.b1 = nn.Parameter(torch.empty(E, g, Fw)) if cfg.bias else None
        self.b2 = nn.Parameter(torch.empty(E, h)) if cfg.bias else None
        self.shared = MLP(replace(cfg, ffn=cfg.shared_ffn)) if cfg.shared_ffn else None
        self.comm: ExpertComm | None = None
        self.first_expert = 0
        self.records: list[list[int]] = []

    def shard(self, comm: ExpertComm) -> None:
        """Keep experts [p*E/ep, (p+1)*E/ep) and the t-th of etp slices of their width."""
        E, Fw = self.cfg.num_experts, self.cfg.expert_ffn
        n, w = E // comm.ep, Fw // comm.etp
        e0, f0 = comm.ep_rank * n, comm.etp_rank * w
        with torch.no_grad():
            self.w1 = nn.Parameter(self.w1[e0:e0 + n, :, f0:f0 + w].clone())
            self.w2 = nn.Parameter(self.w2[e0:e0 + n, :, f0:f0 + w].clone())
            if self.b1 is not None:
                self.b1 = nn.Parameter(self.b1[e0:e0 + n, :, f0:f0 + w].clone())
                self.b2 = nn.Parameter(self.b2[e0:e0 + n].clone())
        self.comm, self.first_expert = comm, e0

    def expert_params(self) -> list[nn.Parameter]:
        return [p for p in (self.w1, self.w2, self.b1, self.b2) if p is not None]

    def _experts(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows (n, h) through local experts ``ids`` (n,) (0-based local), in the rows' order."""
        perm = torch.argsort(ids, stable=True)
        sizes = torch.bincount(ids, minlength=self.w1.shape[0]).tolist()
        outs = []
        for j, part in enumerate(torch.split(rows[perm], sizes)):
            y = torch.einsum("nh,gfh->ngf", part, self.w1[j])
            if self.b1 is not None:
                y = y + self.b1[j]
            y = F.silu(y[:, 0]) * y[:, 1] if y.shape[1] == 2 else F.gelu(y[:, 0])
            y = y @ self.w2[j].T
            if self.b2 is not None and (self.comm is None or self.comm.etp_rank == 0):
                y = y + self.b2[j]
            outs.append(y)
        return torch.zeros_like(rows).index_add(0, perm, torch.cat(outs))

    def forward(self, x):
        shared = self.shared(x) if self.shared is not None else None
        if hasattr(x, "to_local"):
            x = x.to_local()
        b, s, h = x.shape
        xf = x.reshape(b * s, h)
        k = self.cfg.topk
        top, idx = self.router(xf).topk(k, dim=-1)
        weights = F.softmax(top, dim=-1).reshape(-1)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.cfg.num_experts)
        self.records.append(counts.tolist())
        rows = xf[order // k]
        back = self._dispatch(rows, flat[order], counts) if self.comm and \
            self.comm.ep * self.comm.etp > 1 else \
            self._experts(rows, flat[order])
        out = torch.zeros_like(xf).index_add(0, order // k, back * weights[order, None])
        out = out.view(b, s, h)
        return out if shared is None else out + shared

    def _dispatch(self, rows, experts, counts):
        c = self.comm
        n_local = self.cfg.num_experts // c.ep
        every = counts.new_empty(c.etp * c.ep * counts.numel())
        dist.all_gather_into_tensor(every, counts, group=c.tp_ep_group)
        # tp_ep group rank = p*etp + t (etp fastest): view (ep, etp, E) -> (etp, ep, E)
        every = every.view(c.ep, c.etp, -1).transpose(0, 1)
        mine = slice(c.ep_rank * n_local, (c.ep_rank + 1) * n_local)
        send = counts.view(c.ep, n_local).sum(1).tolist()
        recv = every[c.etp_rank, :, mine].sum(1).tolist()
        got = AllToAll.apply(rows, recv, send, c.ep_group) if c.ep > 1 else rows
        local_ids = torch.arange(n_local)

        def ids_of(t):  # local expert id of each row received by ETP peer t
            return torch.cat([local_ids.repeat_interleave(every[t, q, mine]) for q in range(c.ep)])
        if c.etp == 1:
            y = self._experts(got, ids_of(0))
        else:
            sizes = every[:, :, mine].sum((1, 2)).tolist()
            pad = max(sizes)
            gathered = GatherPadded.apply(got, pad, c.etp_group)
            valid = torch.cat([t * pad + torch.arange(n) for t, n in enumerate(sizes)])
            part = self._experts(gathered[valid], torch.cat([ids_of(t) for t in range(c.etp)]))
            y = ScatterPadded.apply(torch.zeros_like(gathered).index_add(0, valid, part),
                                    sizes[c.etp_rank], c.etp_group)
        return AllToAll.apply(y, send, recv, c.ep_group) if c.ep > 1 else y


def expert_groups(pp: int, stage: int, etp: int, ep: int, pp_rank: int, stage_index: int) -> ExpertComm:
    """Create every EP, ETP, ETP x EP and EDP group of the world (dist.new_group is collective:
    every rank makes them all, in one order) and return this rank's, with ``edp_group`` set.

    Megatron-Core's expert rank order within a pipeline stage's ``stage`` ranks (tp-cp-dp
    order): ETP fastest, then EP, then EDP (layout.groups, parallel_state.py L873-906)."""
    edp = stage // (etp * ep)
    mine: dict[str, object] = {}
    t0, p0, d0 = stage_index % etp, (stage_index // etp) % ep, stage_index // (etp * ep)
    me = pp_rank * stage + stage_index
    sizes = {"etp": etp, "ep": ep, "edp": edp, "pp": pp}
    for name, kind in (("ep", "ep"), ("etp", "etp"), ("tp_ep", "ep_etp"), ("edp", "edp")):
        for ranks in groups.ranks(sizes, groups.ORDERS["megatron"][1], groups.KINDS[kind][1]).tolist():
            g = dist.new_group(sorted(ranks))
            if me in ranks:
                mine[name] = g
    comm = ExpertComm(mine["ep"], mine["etp"], mine["tp_ep"], ep, etp, p0, t0)
    comm.edp_group, comm.edp_rank = mine["edp"], d0
    return comm
