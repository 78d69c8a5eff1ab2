"""Every collective of a training step, per layer, per micro-batch and per step: the one source
of communication volumes. cost.step times exactly these; the validator checks exactly these
(with the named delta of the torch implementation it runs, validate.torch_volumes).

A ``Collective`` is one kind of call on one process group: its calls and payload per unit
(``per``: a layer of one micro-batch, a micro-batch, or the step) on one GPU, the phase it runs
in and what may hide it (``overlap``). Payload S follows formulas.md 5.1: all-reduce buffer,
all-gather OUTPUT and reduce-scatter INPUT (both unsharded), p2p message. Groups: ``tp``,
``cp``, ``pp`` (pipeline neighbours), ``dp`` (the dense-gradient group: dp*cp ranks tp apart,
LayoutDegrees.grad_group) and ``embd`` (first and last pipeline rank, tied embeddings). Calls
are zero where the group has one rank. All values are arrays broadcast over candidates.

Megatron-Core as modelled (formulas.md 5.4-5.7):
- TP per layer per micro-batch, activation X = (s/cp)*b*h*e: without SP 2 all-reduces forward
  (attention and MLP outputs) and 2 backward (the input gradients of QKV and fc1, which Megatron
  overlaps with their weight-gradient GEMMs); with SP 2 all-gathers + 2 reduce-scatters
  forward, and backward 2 all-gathers (of the row-parallel outputs' gradients), 2
  reduce-scatters (the input gradients, overlapped with the weight gradients) and 2 re-gathers
  of the stored s/t input (overlapped with the input-gradient GEMMs). Full recompute repeats the
  forward's.
- CP ring (``--cp-comm-type p2p``) per layer per micro-batch: cp-1 sends of X_kv forward, 2(cp-1)
  backward (K/V and dK/dV), each step overlapped with the attention of the block in hand;
  full recompute repeats the forward's.
- Edges per micro-batch: the embedding's all-reduce (no SP) or reduce-scatter (SP) on rank 0;
  on the last rank the output layer's input all-gather (SP, forward) and its input-gradient
  all-reduce (no SP) or reduce-scatter (SP) in backward, which Megatron issues asynchronously
  and overlaps with the output layer's weight-gradient GEMM (its async TP all-reduce /
  reduce-scatter in linear_with_grad_accumulation_and_async_allreduce), and the vocab-parallel
  cross entropy's 3 fp32 all-reduces of s*b/cp values (max, sum of exponentials, target logit).
- Pipeline p2p per micro-batch: each chunk sends its output forward and its input gradient
  backward (b*(s/cp)*h*e/t with SP or Narayanan's scatter/gather, else /1); rank 0's first
  chunk sends no gradient and the last rank's last chunk no activation.
- Once per step: dense gradients over the dp*cp group, ZeRO 0 all-reduce, 1 (and the
  distributed optimizer) reduce-scatter + parameter all-gather; ZeRO 2 reduce-scatter every
  micro-batch + one all-gather; ZeRO 3 per micro-batch an all-gather in forward and in backward
  and a reduce-scatter (formulas.md 5.6; one bucket per stage). SP norm (and row-parallel bias)
  gradients: one coalesced all-reduce over tp. Tied embeddings with pp > 1: one all-reduce of
  the word-embedding gradient between the first and last rank.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from . import model_counts as mc
from .model_flops import vocab_per_rank
from .context_parallel import kv_chunk_bytes
from .memory import non_expert_params, rank_params
from .traffic import Collective, Elements
from . import blocks, moe, pipeline
from .blocks import rank_blocks

GROUPS = ("tp", "cp", "pp", "dp", "embd")


def _x_bytes(model: ModelSpec, training: TrainingSpec, c, elem: Elements):
    """X = (s/cp)*b*h*e: one micro-batch's hidden states on one GPU (formulas.md 5.4)."""
    return c.tokens_per_microbatch(training.seq_length) * model.hidden_size * elem.act


def _tp_block(x, on_tp, sp, full, what: str, xg=None) -> list[Collective]:
    """The TP/SP collectives of one TP-sharded block (attention, or an MLP: dense or the shared
    experts) for one micro-batch: without SP an all-reduce of its output forward and of its
    input gradient backward (hidden under the weight-gradient GEMMs); with SP an all-gather of
    the input and a reduce-scatter of the output forward, and backward a reduce-scatter of the
    input gradient and a re-gather of the stored input (both hidden) and an all-gather of the
    output gradient; full recompute repeats the forward's. ``xg``: the bytes of the all-gathers
    (X in 16 bits; FP8 where the linear layers quantize before gathering), default X."""
    xg = x if xg is None else xg
    no_sp, with_sp = np.where(sp, 0.0, 1.0) * on_tp, np.where(sp, 1.0, 0.0) * on_tp
    out = []
    for phase, calls in (("forward", 1.0), ("recompute", np.where(full, 1.0, 0.0))):
        out += [Collective("tp", "all_reduce", "layer", phase, "", no_sp * calls, x, f"{what} output all-reduce"),
                Collective("tp", "all_gather", "layer", phase, "", with_sp * calls, xg, f"SP all-gather of the {what} input"),
                Collective("tp", "reduce_scatter", "layer", phase, "", with_sp * calls, x,
                           f"SP reduce-scatter of the {what} output")]
    return out + [
        Collective("tp", "all_reduce", "layer", "backward", "wgrad", no_sp, x, f"{what} input-gradient all-reduce"),
        Collective("tp", "reduce_scatter", "layer", "backward", "wgrad", with_sp, x,
                   f"SP input-gradient reduce-scatter of the {what}"),
        Collective("tp", "all_gather", "layer", "backward", "wgrad", with_sp, xg,
                   f"SP re-gather of the stored {what} input for the weight gradients"),
        Collective("tp", "all_gather", "layer", "backward", "", with_sp, xg,
                   f"SP all-gather of the {what} output gradient")]


def _cp_ring(model: ModelSpec, training: TrainingSpec, c, elem: Elements, full) -> list[Collective]:
    """The CP ring of one attention block for one micro-batch: cp-1 sends of X_kv forward,
    2(cp-1) backward (K/V and its gradient), repeated by full recompute."""
    cp = np.asarray(c.cp, dtype=np.float64)
    steps = (cp - 1) * (cp > 1)
    x_kv = kv_chunk_bytes(model, training, c, elem.act)
    out = []
    for phase, calls in (("forward", steps), ("backward", 2 * steps), ("recompute", np.where(full, steps, 0.0))):
        for kind in ("send", "recv"):
            out.append(Collective("cp", kind, "layer", phase, "attention", calls, x_kv,
                                  "CP ring K/V block" + (" and its gradient" if phase == "backward" else "")))
    return out


def block_collectives(model: ModelSpec, training: TrainingSpec, c, elem: Elements) -> dict[str, list[Collective]]:
    """The collectives of ONE block of each kind (blocks.block_kinds) for ONE micro-batch on one
    GPU (every pipeline rank alike): {kind: [Collective]}. Attention blocks: TP/SP and the CP
    ring; a dense MLP: TP/SP; an MoE block: the shared experts' TP/SP and the token dispatch
    and combine (moe.expert_collectives). A layer is an attention block and an MLP block."""
    x = _x_bytes(model, training, c, elem)
    xg = x * (elem.gathered / elem.act)
    on_tp = (np.asarray(c.tp) > 1).astype(np.float64)
    sp = np.asarray(c.sequence_parallel)
    full = np.asarray(c.recompute) == 2
    attention = _tp_block(x, on_tp, sp, full, "attention", xg) + _cp_ring(model, training, c, elem, full)
    out = {}
    for kind in blocks.block_kinds(model):
        if kind in (blocks.ATTENTION, blocks.WINDOW):
            out[kind] = attention
        elif kind == blocks.MLP:
            out[kind] = _tp_block(x, on_tp, sp, full, "MLP", xg)
        else:
            shared = on_tp * (model.moe.shared_experts > 0)
            out[kind] = _tp_block(x, shared, sp, full, "shared experts", xg) + \
                moe.expert_collectives(model, training, c, elem, full)
    return out


def edge_collectives(model: ModelSpec, training: TrainingSpec, c, rank, elem: Elements) -> list[Collective]:
    """Per micro-batch on pipeline rank ``rank``: the embedding's TP collective (rank 0), the
    output layer's and the cross entropy's (the rank that runs the loss, pipeline.runs_loss:
    the last; rank 0 in the V shapes). List of Collective."""
    x = _x_bytes(model, training, c, elem)
    on_tp = (np.asarray(c.tp) > 1).astype(np.float64)
    sp = np.asarray(c.sequence_parallel)
    first = (np.asarray(rank) == 0) * on_tp
    last = pipeline.runs_loss(c, rank) * on_tp
    tokens = c.tokens_per_microbatch(training.seq_length)
    return [
        Collective("tp", "all_reduce", "microbatch", "forward", "", np.where(sp, 0.0, first), x,
                   "embedding output all-reduce"),
        Collective("tp", "reduce_scatter", "microbatch", "forward", "", np.where(sp, first, 0.0), x,
                   "SP embedding output reduce-scatter"),
        Collective("tp", "all_gather", "microbatch", "forward", "", np.where(sp, last, 0.0), x,
                   "SP all-gather of the output layer's input"),
        Collective("tp", "reduce_scatter", "microbatch", "backward", "wgrad", np.where(sp, last, 0.0), x,
                   "SP reduce-scatter of the output layer's input gradient"),
        Collective("tp", "all_reduce", "microbatch", "backward", "wgrad", np.where(sp, 0.0, last), x,
                   "output layer input-gradient all-reduce"),
        Collective("tp", "all_reduce", "microbatch", "forward", "", 3.0 * last, tokens * 4.0,
                   "vocab-parallel cross entropy (max, sum of exponentials, target logit), fp32"),
    ]


def p2p_payload(model: ModelSpec, training: TrainingSpec, c, elem: Elements):
    """Bytes of one pipeline message: b*(s/cp)*h*e, divided by tp with SP or with Narayanan
    2021 Sec. 4.1's scatter/gather (``training.p2p_scatter_gather``: each TP rank sends 1/t)."""
    split = np.where(np.asarray(c.sequence_parallel) | training.p2p_scatter_gather, c.tp, 1)
    return _x_bytes(model, training, c, elem) / split


def p2p_collectives(model: ModelSpec, training: TrainingSpec, c, rank, elem: Elements) -> list[Collective]:
    """Pipeline sends and receives per micro-batch on rank ``rank``: 2*vpp, less one on rank 0
    (its first chunk sends no gradient back) and one on the last rank (its last chunk sends no
    activation on). In the V shapes (ZB-V, DualPipeV: stages r and 2p-1-r on rank r) the turn
    from stage p-1 to p stays on rank p-1: 2 per neighbouring rank, 4 on a middle rank, 2 on
    rank 0 and p-1 (pipeline.v_shaped). Timed by the schedule (cost.step). List of Collective."""
    rank = np.asarray(rank)
    pp = np.asarray(c.pp)
    calls = 2.0 * np.asarray(c.vpp) - (rank == 0) - (rank == pp - 1)
    v_shaped = pipeline.v_shaped(c)
    if np.any(v_shaped):
        calls = np.where(v_shaped, 2.0 * ((rank > 0).astype(float) + (rank < pp - 1)), calls)
    calls = calls * (pp > 1)
    payload = p2p_payload(model, training, c, elem)
    return [Collective("pp", kind, "microbatch", "step", "schedule", calls, payload,
                       "activation forward, its gradient backward") for kind in ("send", "recv")]


def dp_collectives(model: ModelSpec, training: TrainingSpec, c, rank, elem: Elements) -> list[Collective]:
    """Dense-gradient and ZeRO traffic of rank ``rank`` over the dp*cp group (formulas.md 5.6),
    the SP norm-gradient all-reduce and the tied-embedding all-reduce. List of Collective."""
    p = rank_params(model, c, rank)
    held = _stage_held(training, c)
    out = _dp_group(non_expert_params(p), c.grad_group, "dp", c, elem, held=held)
    if model.moe is not None:
        out += _dp_group(p["experts"], c.edp, "edp", c, elem, "expert ", held)
    rank = np.asarray(rank)
    pp = np.asarray(c.pp)
    last = rank == pp - 1
    norms = (2.0 * p["layers"] + last) * mc.norm_params(model)  # two per layer + the final norm
    biases = 2.0 * p["layers"] * model.hidden_size if model.bias else 0.0
    sp_on = np.asarray(c.sequence_parallel) * (np.asarray(c.tp) > 1)
    out.append(Collective("tp", "all_reduce", "step", "step", "", sp_on * 1.0,
                          (norms + biases) * elem.grad,
                          "SP norm and row-parallel bias gradients, coalesced"))
    tied = model.tie_embeddings * (pp > 1) * ((rank == 0) | last)
    out.append(Collective("embd", "all_reduce", "step", "step", "", tied * 1.0,
                          vocab_per_rank(model, c.tp) * model.hidden_size * elem.grad,
                          "tied word-embedding gradient, first <-> last rank"))
    return out


def _stage_held(training: TrainingSpec, c) -> np.ndarray:
    """1.0 where ZeRO-3 keeps the stage's parameters gathered across micro-batches (FSDP2 under
    PP, ``pp_unsharded_params``: reshard_after_forward=False, pytorch/torchtitan
    parallelize_llama.py apply_fsdp @9dec370), else 0.0. PyTorch pipelining then also skips the
    gradient reduce-scatter of all but the last micro-batch (torch/distributed/pipelining/
    stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False)), so a held stage
    gathers and reduce-scatters once per step. Float array broadcast over candidates."""
    on = bool(training.pp_unsharded_params)
    return ((np.asarray(c.pp) > 1) & on).astype(np.float64)


def _dp_group(params, size, group: str, c, elem: Elements, what: str = "",
              held=0.0) -> list[Collective]:
    """The DP/ZeRO collectives of ``params`` per GPU reduced and sharded over a group of
    ``size`` ranks (dense: dp*cp; experts: edp), by the ZeRO stage that applies. ``held``
    (_stage_held, 0/1 array): ZeRO-3 gathers and reduce-scatters once per step instead of per
    micro-batch (forward gather + backward gather + reduce-scatter per micro-batch otherwise)."""
    grad, weight = params * elem.grad, params * elem.weight
    on = (np.asarray(size) > 1).astype(np.float64)
    z = c.sharding_stage
    zs = {k: np.where(z == k, on, 0.0) for k in range(4)}
    z3_step, z3_micro = zs[3] * held, zs[3] * (1.0 - held)
    out = [
        Collective(group, "all_reduce", "step", "backward", "backward", zs[0], grad, what + "gradient all-reduce"),
        Collective(group, "reduce_scatter", "step", "backward", "backward", zs[1], grad,
                   what + "gradient reduce-scatter (distributed optimizer / ZeRO-1)"),
        Collective(group, "all_gather", "step", "forward", "forward", zs[1] + zs[2], weight,
                   what + "updated-parameter all-gather"),
        Collective(group, "reduce_scatter", "microbatch", "backward", "backward", zs[2], grad,
                   what + "ZeRO-2 gradient reduce-scatter"),
        Collective(group, "all_gather", "microbatch", "forward", "forward", z3_micro, weight,
                   "ZeRO-3 parameter all-gather for the forward"),
        Collective(group, "all_gather", "microbatch", "backward", "backward", z3_micro, weight,
                   "ZeRO-3 parameter all-gather for the backward"),
        Collective(group, "reduce_scatter", "microbatch", "backward", "backward", z3_micro, grad,
                   "ZeRO-3 gradient reduce-scatter"),
        Collective(group, "all_gather", "step", "forward", "forward", z3_step, weight,
                   "ZeRO-3 parameter all-gather, once per step (stage held gathered under PP)"),
        Collective(group, "reduce_scatter", "step", "backward", "backward", z3_step, grad,
                   "ZeRO-3 gradient reduce-scatter, once per step (last micro-batch)"),
    ]
    return out


def rank_collectives(model: ModelSpec, training: TrainingSpec, c, rank,
                     elem: Elements | None = None) -> list[Collective]:
    """Every collective of pipeline rank ``rank`` (Megatron-Core): the per-layer ones
    (block_collectives, each marked with its block) and the rank's edges, p2p, DP/ZeRO, norm and
    tied-embedding ones."""
    elem = Elements.of(training) if elem is None else elem
    layer = [replace(x, block=kind) for kind, colls in block_collectives(model, training, c, elem).items()
             for x in colls]
    return (layer + edge_collectives(model, training, c, rank, elem)
            + p2p_collectives(model, training, c, rank, elem) + dp_collectives(model, training, c, rank, elem))


def per_step(model: ModelSpec, training: TrainingSpec, c, rank, coll: Collective):
    """(calls, bytes) of ``coll`` in one optimizer step on rank ``rank``: per-block ones times
    the rank's blocks of that kind (blocks.rank_blocks) and the micro-batches, micro-batch ones
    times the micro-batches."""
    m = c.num_microbatches(training.global_batch_size)
    times = {"layer": lambda: m * rank_blocks(model, c, rank)[coll.block], "microbatch": lambda: m,
             "step": lambda: 1}[coll.per]()
    calls = coll.calls * times
    return calls, calls * coll.payload
