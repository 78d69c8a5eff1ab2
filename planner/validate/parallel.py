"""Parallelize the decoder on a DeviceMesh (pp, dp, cp, tp) in Megatron's rank order (tp fastest,
then cp, dp, pp). CP: model.set_context_parallel; dense gradients are reduced over dp*cp.

TP/SP: torch.distributed.tensor.parallel (Colwise/Rowwise/SequenceParallel/PrepareModule*).
PP: torch.distributed.pipelining (Schedule1F1B; ScheduleInterleaved1F1B with looped stage ids
when vpp > 1). DP: FSDP2 ``fully_shard`` per layer and per chunk for ZeRO-3
(reshard_after_forward=True) and ZeRO-2 (False); ZeRO-0/1 use ``FlatOptimizer`` below (one
flat all-reduce, or reduce-scatter + all-gather, per step: Megatron's DDP / distributed
optimizer with one bucket). Full recompute wraps each layer in a non-reentrant checkpoint.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from ..layout import groups
from .model import GPT, Chunk
from .instrument import recompute_context


def stage_ids(pp_rank: int, pp: int, vpp: int, v_shape: bool = False) -> list[int]:
    """Assignment of pipeline stages (model chunks) to one PP rank: looped, r, r+pp, r+2pp, ...;
    ``v_shape`` (ZB-V, DualPipeV: vpp = 2), r and 2pp-1-r (torchtitan pipeline_parallel.py
    L558-567; schedule.orders' "v" placement)."""
    if v_shape:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(vpp)]


def build_chunks(model: GPT, pp_rank: int, pp: int, vpp: int,
                 counts: list[int] | None = None, v_shape: bool = False) -> list[tuple[int, Chunk]]:
    """This rank's (stage id, Chunk) list, cut from ``model``: ``counts[sid]`` layers in stage
    sid (an uneven split), or the layers split evenly over pp*vpp stages when counts is None;
    stages placed by stage_ids (``v_shape``)."""
    n_stages = pp * vpp
    if counts is None:
        counts = [model.cfg.num_layers // n_stages] * n_stages
    starts = [sum(counts[:k]) for k in range(n_stages)]
    chunks = []
    for sid in stage_ids(pp_rank, pp, vpp, v_shape):
        layers = {str(i): model.layers[str(i)] for i in range(starts[sid], starts[sid] + counts[sid])}
        chunks.append((sid, Chunk(model.embed if sid == 0 else None, layers,
                                  model.head if sid == n_stages - 1 else None)))
    return chunks


def tp_plan_block(sp: bool, mlp: str | None = "mlp") -> dict:
    """Megatron-style TP plan of one layer; with SP the norms run on sequence shards. ``mlp``:
    the TP-sharded MLP's path ("mlp"; "mlp.shared" for an MoE layer's shared expert; None for
    an MoE layer without one: its routed experts are sharded by expert parallelism instead and
    run on this rank's sequence shard, as Megatron-Core's MoE layer under SP)."""
    if not sp:
        plan = {"attn.qkv": ColwiseParallel(), "attn.o": RowwiseParallel()}
        return plan if mlp is None else {**plan, f"{mlp}.fc1": ColwiseParallel(),
                                         f"{mlp}.fc2": RowwiseParallel()}
    gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {"ln1": SequenceParallel(), "attn": PrepareModuleInput(**gather),
            "attn.qkv": ColwiseParallel(), "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel()}
    if mlp is None:
        return plan
    return {**plan, mlp: PrepareModuleInput(**gather), f"{mlp}.fc1": ColwiseParallel(),
            f"{mlp}.fc2": RowwiseParallel(output_layouts=Shard(1))}


def mlp_path(layer) -> str | None:
    """The TP-sharded MLP of a layer: "mlp", "mlp.shared" (MoE with a shared expert) or None."""
    if not hasattr(layer.mlp, "router"):
        return "mlp"
    return "mlp.shared" if layer.mlp.shared is not None else None


def apply_tp(chunk: Chunk, tp_mesh, sp: bool) -> None:
    """Vocab-parallel embedding (all-reduce), TP layers, output layer gathering the logits."""
    if chunk.embed is not None:
        parallelize_module(chunk.embed, tp_mesh, {
            "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())})
        if sp:  # Replicate -> Shard(1) is a local slice forward, an all-gather backward
            parallelize_module(chunk.embed, tp_mesh, PrepareModuleOutput(
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                use_local_output=True))
    for layer in chunk.layers.values():
        parallelize_module(layer, tp_mesh, tp_plan_block(sp, mlp_path(layer)))
    if chunk.head is not None:
        plan = {"out": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                       output_layouts=Replicate())}
        if sp:
            plan["norm"] = SequenceParallel()
        parallelize_module(chunk.head, tp_mesh, plan)


def apply_full_recompute(chunk: Chunk) -> None:
    """Wrap each layer in a non-reentrant activation checkpoint (recompute = full); what its
    recomputation saves is counted by instrument.SavedBytes (recompute_context)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name in list(chunk.layers.keys()):
        chunk.layers[name] = checkpoint_wrapper(chunk.layers[name], context_fn=recompute_context)


def apply_fsdp(chunk: Chunk, dp_mesh, zero: int) -> None:
    """FSDP2 units: each layer, then the chunk (embedding / head / norm). ZeRO-3 reshards after forward."""
    from torch.distributed.fsdp import fully_shard
    reshard = zero >= 3
    for layer in chunk.layers.values():
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard)


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of a DTensor (or the tensor itself)."""
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def reduce_partial_grads(params) -> None:
    """Give every DTensor gradient its parameter's placement (validator_notes.md section 2).

    SP norm gradients come out Partial(sum) over tp: one all-reduce each here (as Megatron's
    norm-gradient all-reduce), instead of one hidden all-reduce per optimizer op that reads them.
    The vocab-parallel embedding's gradient comes out Replicate: a local slice to Shard(0).
    """
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


def embedding_groups(sizes: dict[str, int]):
    """Process groups {first stage, last stage} for each (dp, cp, tp) coordinate (tied embeddings):
    the ends of each pipeline group (layout.groups, ``sizes``: tp, cp, dp, pp). Every rank
    creates every group (dist.new_group is collective); returns this rank's group.
    """
    mine = None
    me = dist.get_rank()
    for ranks in groups.ranks(sizes, groups.ORDERS["megatron"][0], ("pp",))[:, [0, -1]].tolist():
        g = dist.new_group(ranks)
        if me in ranks:
            mine = g
    return mine


class FlatOptimizer:
    """ZeRO-0/1 over the DP group: one flat gradient buffer per step, Adam on a flat master copy.

    ZeRO-0: all-reduce the flat gradients (payload P_l*e), Adam on the full master copy.
    ZeRO-1: reduce-scatter them (payload P_l*e, padded to a multiple of dp), Adam on this
    rank's 1/dp shard of the master copy, all-gather the updated parameters (payload the same).
    Gradients are averaged over DP (sum, then / dp), as DDP and FSDP do. Expert parameters get
    their own instance over the EDP group with ``divisor`` dp*cp: each EP group's ranks hold the
    gradient of the tokens routed to them from dp*cp/edp data shards, so the sum over EDP
    divided by dp*cp is the mean (Megatron-Core's expert gradient scaling, moe.md 3.3).
    """

    def __init__(self, params: list[nn.Parameter], group, zero: int, lr: float,
                 divisor: int | None = None):
        self.params = params
        self.group = group
        self.n = dist.get_world_size(group) if group is not None else 1
        self.divisor = divisor or self.n  # experts: summed over edp, averaged over dp*cp
        self.zero = zero
        self.numels = [local(p).numel() for p in params]
        total = sum(self.numels)
        self.padded = -(-total // self.n) * self.n
        flat = self._flat([local(p).detach() for p in params])
        if zero >= 1:
            r = dist.get_rank(group) if group is not None else 0
            size = self.padded // self.n
            self.master = flat[r * size:(r + 1) * size].clone()
        else:
            self.master = flat.clone()
        self.master.requires_grad_(True)
        self.adam = torch.optim.Adam([self.master], lr=lr, foreach=False)

    def _flat(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))

    @torch.no_grad()
    def step(self) -> None:
        grads = self._flat([local(p.grad) for p in self.params])
        if self.n > 1:
            if self.zero >= 1:
                shard = torch.empty_like(self.master)
                dist.reduce_scatter_tensor(shard, grads, group=self.group)
                grads = shard
            else:
                dist.all_reduce(grads, group=self.group)
        grads.div_(self.divisor)
        self.master.grad = grads
        self.adam.step()
        self.master.grad = None
        full = self.master.detach()
        if self.zero >= 1 and self.n > 1:
            full = torch.empty(self.padded, dtype=full.dtype, device=full.device)
            dist.all_gather_into_tensor(full, self.master.detach(), group=self.group)
        offset = 0
        for p, n in zip(self.params, self.numels):
            local(p).copy_(full[offset:offset + n].view_as(local(p)))
            offset += n

    def state_bytes(self) -> int:
        """Bytes of the master copy and Adam's m and v (the 'step' counters are not counted)."""
        st = self.adam.state.get(self.master, {})
        extra = sum(v.numel() * v.element_size() for k, v in st.items()
                    if k != "step" and isinstance(v, torch.Tensor))
        return self.master.numel() * self.master.element_size() + extra
