"""What the validator's torch implementation moves, as a named delta on cost.volumes, and the
per-rank per-step totals the validator compares with (``step_volumes``).

``planner.validate`` builds the layout with DTensor TP/SP, torch.distributed.pipelining, FSDP2
and its own all-gather CP on torch 2.13. Where that moves other bytes than the Megatron-Core
collectives cost.volumes lists (and cost.step times), each difference is one named function
below, applied in TORCH_DELTA's order; each was counted on 8 gloo ranks (validator_notes.md
section 6, tests/test_validate*.py):

- ``sp_backward_keeps_gathered_input``: autograd saves the SP all-gathered input, so the
  backward has no re-gathers (more activation memory, less traffic).
- ``checkpoint_stops_early``: full recompute (non-reentrant checkpoint) stops at the last tensor
  backward needs: it repeats 2 all-gathers and 1 reduce-scatter per layer with SP, 1 all-reduce
  without.
- ``embedding_all_reduce``: the embedding's output is all-reduced in both modes (DTensor's
  Partial -> Replicate), and with SP sliced (no call) forward and all-gathered in backward.
- ``logits_all_gather``: plain cross entropy on replicated logits: one all-gather of
  b*(s/cp)*V_p*e per micro-batch instead of the vocab-parallel loss's 3 fp32 all-reduces.
- ``sp_norms_per_tensor``: one all-reduce per norm tensor (weight, bias) per step, not one
  coalesced call; row-parallel biases need none.
- ``flat_buffer_padding``: ZeRO 0/1 run Megatron's flat buffer, padded to a multiple of dp*cp.
- ``fsdp2_units``: ZeRO 2/3 run FSDP2 with one unit per layer and one per chunk root (embedding,
  head): under pipelining each unit reduce-scatters once per step (gradient sync on the last
  backward only); ZeRO-2 (reshard_after_forward=False) all-gathers each unit once per step,
  ZeRO-3 m+1 times (every forward after a forward resharded it, every first backward after a
  forward gathers it again).
- ``tied_gradient_sharded``: with ZeRO-2/3 the tied-embedding all-reduce moves the dp*cp-sharded
  gradient.
- ``cp_all_gather``: context parallel as Llama 3's all-gather form, not Megatron's ring: per
  layer per micro-batch one all-gather of the stacked K and V over cp (payload cp*X_kv, the whole
  sequence's), repeated by recompute (full, or selective: the attention core), and one
  reduce-scatter of dK, dV in backward.

Experts (planner.validate.moe, predicted by cost.moe_dispatch.moe_dispatch_volumes with
impl="torch" from the routing the ranks recorded; planner.validate.moe_plan corrects the dense
collectives for MoE layers): the torch dispatcher sends no router probabilities (the weights are
applied on the source rank after the combine; Megatron sends the fp32 probs with one more
all-to-all each way), pads the ETP all-gather and reduce-scatter to the largest peer (gloo has
no uneven all-gather; Megatron gathers exact sizes and reduce-scatters in the probs dtype),
all-gathers the per-expert counts over ETP x EP as int64, and all-reduces each router gradient
over TP once per step (Megatron: with the SP norm gradients, coalesced).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np

from ..layout import Candidates
from ..layout import Layout
from ..specs import ModelSpec, TrainingSpec
from ..cost import model_counts as mc
from ..cost.model_flops import padded_vocab
from ..cost.context_parallel import kv_chunk_bytes
from ..cost.memory import non_expert_params, rank_params
from ..cost.traffic import Collective, Elements
from ..cost.volumes import per_step, rank_collectives

Key = tuple[str, str]


def _drop(colls, pred):
    return [x for x in colls if not pred(x)]


def sp_backward_keeps_gathered_input(colls, **_):
    return _drop(colls, lambda x: x.what.startswith("SP re-gather"))


def checkpoint_stops_early(colls, **_):
    out = []
    for x in colls:
        if x.phase == "recompute" and x.group == "tp" and x.kind in ("reduce_scatter", "all_reduce"):
            x = replace(x, calls=x.calls / 2)
        out.append(x)
    return out


def embedding_all_reduce(colls, c, elem, model, training, rank, **_):
    sp = np.asarray(c.sequence_parallel)
    on = (np.asarray(rank) == 0) * (np.asarray(c.tp) > 1) * 1.0
    x = c.tokens_per_microbatch(training.seq_length) * model.hidden_size * elem.act
    out = _drop(colls, lambda x: x.what in ("embedding output all-reduce", "SP embedding output reduce-scatter"))
    return out + [Collective("tp", "all_reduce", "microbatch", "forward", "", on, x, "embedding output all-reduce"),
                  Collective("tp", "all_gather", "microbatch", "backward", "", np.where(sp, on, 0.0), x,
                             "SP embedding input-gradient all-gather")]


def logits_all_gather(colls, c, elem, model, training, rank, **_):
    last = (np.asarray(rank) == np.asarray(c.pp) - 1) * (np.asarray(c.tp) > 1) * 1.0
    vocab = padded_vocab(model.vocab_size, c.tp)
    logits = c.tokens_per_microbatch(training.seq_length) * vocab * elem.act
    out = _drop(colls, lambda x: x.what.startswith("vocab-parallel cross entropy"))
    return out + [Collective("tp", "all_gather", "microbatch", "forward", "", last, logits, "logits all-gather")]


def sp_norms_per_tensor(colls, c, elem, model, rank, **_):
    p = rank_params(model, c, rank)
    last = np.asarray(rank) == np.asarray(c.pp) - 1
    tensors = (2.0 * p["layers"] + last) * mc.norm_params(model) / model.hidden_size  # gamma (+ beta)
    sp_on = np.asarray(c.sequence_parallel) * (np.asarray(c.tp) > 1)
    out = _drop(colls, lambda x: x.what.startswith("SP norm"))
    return out + [Collective("tp", "all_reduce", "step", "step", "", sp_on * tensors,
                             model.hidden_size * elem.grad, "SP norm gradient, per tensor")]


def _params(model, c, rank) -> dict[str, float]:
    return {k: float(np.asarray(v).ravel()[0]) for k, v in rank_params(model, c, rank).items()}


def flat_buffer_padding(colls, c, elem, model, rank, **_):
    p = _params(model, c, rank)
    n = float(np.asarray(c.grad_group).ravel()[0])
    padded = -(-non_expert_params(p) // n) * n
    return [replace(x, payload=padded * (elem.weight if x.kind == "all_gather" else elem.grad))
            if x.group == "dp" and x.per == "step" else x for x in colls]


def fsdp2_units(colls, c, elem, model, training, rank, **_):
    stage = int(np.asarray(c.sharding_stage).ravel()[0])
    if stage < 2 or int(np.asarray(c.grad_group).ravel()[0]) == 1:
        return colls
    p = _params(model, c, rank)
    roots = [p["embedding"] + p["head"]] if int(np.asarray(c.pp).ravel()[0]) == 1 else \
        [p["embedding"], p["head"]]
    units = [p["layer"]] * int(p["layers"]) + [u for u in roots if u]
    m = int(np.asarray(c.num_microbatches(training.global_batch_size)).ravel()[0])
    gathers = m + 1 if stage == 3 else 1
    out = _drop(colls, lambda x: x.group == "dp")
    for u in units:
        out += [Collective("dp", "all_gather", "step", "step", "", float(gathers), u * elem.weight,
                           "FSDP2 unit all-gather"),
                Collective("dp", "reduce_scatter", "step", "step", "", 1.0, u * elem.grad,
                           "FSDP2 unit gradient reduce-scatter")]
    return out


def tied_gradient_sharded(colls, c, **_):
    shard = np.where((c.sharding_stage >= 2) & (np.asarray(c.grad_group) > 1), c.grad_group, 1)
    return [replace(x, payload=x.payload / shard) if x.group == "embd" else x for x in colls]


def cp_all_gather(colls, c, elem, model, training, **_):
    cp = np.asarray(c.cp, dtype=np.float64)
    on = (cp > 1) * 1.0
    x_kv = kv_chunk_bytes(model, training, c, elem.act)
    again = np.where(np.asarray(c.recompute) >= 1, 1.0, 0.0)
    out = _drop(colls, lambda x: x.group == "cp")
    return out + [Collective("cp", "all_gather", "layer", "forward", "", on * (1 + again), cp * x_kv,
                             "CP all-gather of the stacked K and V (and its recompute)", "attention"),
                  Collective("cp", "reduce_scatter", "layer", "backward", "", on, cp * x_kv,
                             "CP reduce-scatter of dK and dV", "attention")]


TORCH_DELTA = (sp_backward_keeps_gathered_input, checkpoint_stops_early, embedding_all_reduce,
               logits_all_gather, sp_norms_per_tensor, flat_buffer_padding, fsdp2_units,
               tied_gradient_sharded, cp_all_gather)


def torch_delta(model: ModelSpec, training: TrainingSpec, c, rank: int, elem: Elements,
                colls: list[Collective]) -> list[Collective]:
    """The collectives of rank ``rank`` as the validator's torch implementation runs them: each
    function of TORCH_DELTA applied in turn (module docstring). One layout (arrays of length 1)."""
    for change in TORCH_DELTA:
        colls = change(colls, c=c, elem=elem, model=model, training=training, rank=rank)
    return colls


def step_volumes(model: ModelSpec, training: TrainingSpec, layout: Layout, pp_rank: int = 0, *,
                 impl: Literal["megatron", "torch"] = "megatron", act_bytes: float = 2.0,
                 weight_bytes: float = 2.0, grad_bytes: float | None = None) -> dict[Key, tuple[int, int]]:
    """{(group, kind): (calls, payload bytes)} of one rank of pipeline rank ``pp_rank`` in one
    optimizer step: cost.volumes' collectives of that rank (``impl="megatron"``: what cost.step
    times) or with the torch delta applied (``"torch"``: what planner.validate runs).
    ``act_bytes`` / ``weight_bytes`` / ``grad_bytes``: element sizes (default bf16, bf16,
    training.grad_bytes). Raises ValueError for a pp_rank outside [0, pp). Python ints."""
    if not 0 <= pp_rank < layout.pp:
        raise ValueError(f"pp_rank {pp_rank} outside [0, {layout.pp})")
    c = Candidates.from_layouts([layout])
    elem = Elements(act=act_bytes, weight=weight_bytes,
                    grad=float(training.grad_bytes if grad_bytes is None else grad_bytes))
    colls = rank_collectives(model, training, c, pp_rank, elem)
    if impl == "torch":
        colls = torch_delta(model, training, c, pp_rank, elem, colls)
    out: dict[Key, list[float]] = {}
    for x in colls:
        calls, total = per_step(model, training, c, pp_rank, x)
        calls, total = float(np.asarray(calls).ravel()[0]), float(np.asarray(total).ravel()[0])
        if calls > 0:
            entry = out.setdefault((x.group, x.kind), [0.0, 0.0])
            entry[0] += calls
            entry[1] += total
    return {k: (int(round(n)), int(round(b))) for k, (n, b) in sorted(out.items())}
