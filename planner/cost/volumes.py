"""Bytes moved per rank per step, by (group, collective): what the validator compares against.

``step_volumes`` returns {(group, kind): (calls, payload bytes)} for ONE rank (a pipeline rank
``pp_rank``) and ONE optimizer step. Groups: "tp", "pp", "dp" (mesh dimensions) and "embd" (first
and last pipeline stage, tied embeddings). Kinds: all_reduce, all_gather, reduce_scatter, send,
recv. Payload S follows formulas.md 5.1: all-reduce buffer, all-gather OUTPUT and
reduce-scatter INPUT (both unsharded), p2p message. Wire bytes are phi*S (collectives.py).

Two implementations are described (``impl``):

``"megatron"`` (formulas.md 5.4-5.6, the volumes step.py times): per layer per micro-batch
  TP without SP 2 all-reduces of X forward + 2 backward; with SP 2 all-gathers + 2
  reduce-scatters forward, and backward 2 reduce-scatters + 4 all-gathers (2 re-gathers of the
  stored s/t input); full recompute repeats the forward's collectives. Edges: embedding
  all-reduce (no SP) or reduce-scatter (SP); output layer: backward all-reduce of its input
  gradient (no SP) or forward all-gather + backward reduce-scatter (SP); vocab-parallel cross
  entropy 3 fp32 all-reduces of s*b; SP norm and row-parallel bias gradients: one coalesced
  all-reduce per step. DP: ZeRO-0 one all-reduce of P_l*g, ZeRO-1 reduce-scatter of P_l*g +
  all-gather of P_l*w, ZeRO-2 a reduce-scatter every micro-batch + one all-gather, ZeRO-3
  per micro-batch 2 all-gathers + 1 reduce-scatter (one bucket / one unit per stage).

``"torch"`` (what planner.validate runs with DTensor, pipelining and FSDP2 on torch 2.13;
  each difference was counted on 8 gloo ranks, validator_notes.md and the validator's tests):
  - SP backward has NO re-gathers: autograd saves the all-gathered input (more activation
    memory, less traffic); full recompute (non-reentrant checkpoint) repeats 2 all-gathers and
    only 1 reduce-scatter (no SP: 1 all-reduce) per layer, because it stops at the last tensor
    backward needs.
  - Embedding: all-reduce forward in both modes, and with SP an all-gather in backward (its
    Replicate -> Shard(1) slice). Output layer: all-gather of the logits (b*s*V_p) forward,
    since the loss is plain cross entropy on replicated logits (no vocab-parallel loss).
  - SP norm gradients: one all-reduce per norm tensor (weight, bias) per step, not coalesced;
    row-parallel biases need none.
  - DP ZeRO-0/1: one flat buffer (one call) as Megatron, padded to a multiple of dp. ZeRO-2/3 are
    FSDP2 units (each layer, and the chunk root that holds the embedding or the head): under
    pipelining each unit reduce-scatters once per step (gradient sync only on the last
    backward); ZeRO-2 (reshard_after_forward=False) all-gathers each unit once per step;
    ZeRO-3 all-gathers it m+1 times: every forward after a forward resharded it, every first
    backward after a forward gathers it again, and params stay gathered between backwards
    (a run of F and B that starts with F and ends with B gives m+1 for any schedule).
  - Tied embeddings with pp > 1: one all-reduce between the two copies' gradients; with
    ZeRO-2/3 on the dp-sharded gradient (V_p*h/(tp*dp)).
  - Context parallel (cp > 1): the validator's all-gather form of formulas.md 5.7 (Llama 3
    style), not Megatron's ring: per layer per micro-batch ONE all-gather over "cp" of the
    stacked local K and V, payload (output) 2*b*s*(max(g, tp)/tp)*d_h*e (the whole sequence's
    K and V of this rank's KV heads), and in the backward ONE reduce-scatter of dK, dV of the
    same payload (input). Recompute (full, or selective: the attention core) repeats the
    all-gather once more.

Context parallel, both impls: every TP/PP/logits message carries the rank's s/cp tokens;
micro-batches per step m = B/(dp*b) as without CP; the dense-gradient group "dp" is the dp*cp
ranks (Megatron's intra_dp_cp group: formulas.md 5.7, context.cost_view), so its buffers are
padded and sharded over dp*cp. ``"megatron"`` adds the p2p ring of formulas.md 5.7 on "cp":
per layer per micro-batch cp-1 sends (and receives) of X_kv = 2*(s/cp)*b*(max(g,tp)/tp)*d_h*e
forward, and 2(cp-1) backward (KV and dKV); full recompute repeats the forward's (selective
recompute of the attention core is not modelled on the ring).
Uneven pipeline splits: the rank holds first_stage_layers (pp rank 0), last_stage_layers (the
last) or (L - first - last)/(pp - 2) layers (vpp 1; pipeline.stage_layers).
"""

from __future__ import annotations

from typing import Literal

from ..specs import Layout, ModelSpec, TrainingSpec, padded_vocab
from . import flops

Key = tuple[str, str]


def _layer_params(model: ModelSpec, tp: int) -> float:
    """Parameters of one layer on one TP rank (flops.layer_params_per_gpu, sharded + replicated)."""
    sharded, replicated = flops.layer_params_per_gpu(model, tp)
    return float(sharded + replicated)


def _rank_layers(model: ModelSpec, layout: Layout, pp_rank: int) -> int:
    """Layers on pipeline rank ``pp_rank``: L/pp, or the uneven split (pipeline.stage_layers)."""
    f, la = layout.first_stage_layers, layout.last_stage_layers
    if not f:
        return model.num_layers // layout.pp
    if pp_rank == 0:
        return f
    if pp_rank == layout.pp - 1:
        return la
    return (model.num_layers - f - la) // max(layout.pp - 2, 1)


def rank_params(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[str, float]:
    """Parameters on one GPU of pipeline rank ``pp_rank``, split as FSDP units would hold them.

    Returns {"layer": one layer, "layers": count of layers, "first": embedding (+ learned
    positions) if the rank holds stage 0, "last": final norm + output layer if it holds the last
    stage (the output layer also for tied embeddings when pp > 1, formulas.md 1.3)}.
    """
    h, tp = model.hidden_size, layout.tp
    vocab = padded_vocab(model.vocab_size, tp)
    first = pp_rank == 0
    last = pp_rank == layout.pp - 1
    layers = _rank_layers(model, layout, pp_rank)
    emb = vocab * h / tp + ((model.max_position_embeddings or 0) * h
                            if model.position_embedding == "learned" else 0)
    out = vocab * h / tp if (layout.pp > 1 or not model.tie_embeddings) else 0.0
    return {"layer": _layer_params(model, tp), "layers": layers,
            "first": float(emb) if first else 0.0,
            "last": float(flops.norm_params(model) + out) if last else 0.0}


def step_volumes(model: ModelSpec, training: TrainingSpec, layout: Layout, pp_rank: int = 0, *,
                 impl: Literal["megatron", "torch"] = "megatron", act_bytes: float = 2.0,
                 weight_bytes: float = 2.0, grad_bytes: float | None = None) -> dict[Key, tuple[int, int]]:
    """{(group, kind): (calls, payload bytes)} of one rank of pipeline rank ``pp_rank`` per step.

    ``act_bytes`` is the element size of activations and p2p messages (bf16: 2), ``weight_bytes``
    of gathered weights, ``grad_bytes`` of reduced gradients (default training.grad_bytes).
    Raises ValueError for a pp_rank outside [0, pp). Groups of size 1 move nothing.
    """
    if not 0 <= pp_rank < layout.pp:
        raise ValueError(f"pp_rank {pp_rank} outside [0, {layout.pp})")
    g_b = float(training.grad_bytes if grad_bytes is None else grad_bytes)
    torch_impl = impl == "torch"
    tp, pp, dp, v, cp = layout.tp, layout.pp, layout.dp, layout.vpp, layout.cp
    sp, rc = layout.sequence_parallel, layout.recompute
    b, s, h = layout.micro_batch_size, training.seq_length / cp, model.hidden_size
    m = training.global_batch_size // (dp * b)
    vocab = padded_vocab(model.vocab_size, tp)
    first, last = pp_rank == 0, pp_rank == pp - 1
    n_l = _rank_layers(model, layout, pp_rank)
    x = b * s * h * act_bytes
    out: dict[Key, list[float]] = {}

    def add(group: str, kind: str, calls: float, size: float) -> None:
        if calls <= 0:
            return
        entry = out.setdefault((group, kind), [0, 0.0])
        entry[0] += calls
        entry[1] += calls * size

    if tp > 1:
        full = rc == "full"
        if sp:
            ag_layer = 4 + (2 if full else 0) + (0 if torch_impl else 2)
            rs_layer = 4 + ((1 if torch_impl else 2) if full else 0)
            add("tp", "all_gather", m * n_l * ag_layer, x)
            add("tp", "reduce_scatter", m * n_l * rs_layer, x)
        else:
            ar_layer = 4 + ((1 if torch_impl else 2) if full else 0)
            add("tp", "all_reduce", m * n_l * ar_layer, x)
        if first:
            if torch_impl:
                add("tp", "all_reduce", m, x)
                if sp:
                    add("tp", "all_gather", m, x)
            else:
                add("tp", "reduce_scatter" if sp else "all_reduce", m, x)
        if last:
            if sp:
                add("tp", "all_gather", m, x)
                add("tp", "reduce_scatter", m, x)
            else:
                add("tp", "all_reduce", m, x)
            if torch_impl:
                add("tp", "all_gather", m, b * s * vocab * act_bytes)
            else:
                add("tp", "all_reduce", 3 * m, b * s * 4.0)
        if sp:
            norm_tensors = 2 if model.norm == "layernorm" else 1
            n_norms = 2 * n_l + (1 if last else 0)
            if torch_impl:
                add("tp", "all_reduce", n_norms * norm_tensors, h * g_b)
            else:
                biases = 2 * n_l * h if model.bias else 0
                add("tp", "all_reduce", 1, (n_norms * norm_tensors * h + biases) * g_b)

    if cp > 1:
        kv = 2.0 * b * s * (max(model.kv_heads, tp) / tp) * model.kv_channels * act_bytes
        if torch_impl:
            again = 1 if rc in ("full", "selective") else 0
            add("cp", "all_gather", m * n_l * (1 + again), cp * kv)
            add("cp", "reduce_scatter", m * n_l, cp * kv)
        else:
            steps = (cp - 1) * (3 + (1 if rc == "full" else 0))
            add("cp", "send", m * n_l * steps, kv)
            add("cp", "recv", m * n_l * steps, kv)

    if pp > 1:
        p2p = b * s * h / (tp if sp else 1) * act_bytes
        sends = m * (2 * v - (1 if first else 0) - (1 if last else 0))
        add("pp", "send", sends, p2p)
        add("pp", "recv", sends, p2p)

    params = rank_params(model, layout, pp_rank)
    p_local = params["layer"] * params["layers"] + params["first"] + params["last"]
    zero = layout.zero_stage
    dp = dp * cp  # the dense-gradient group: dp*cp ranks
    if dp > 1:
        if torch_impl and zero >= 2:
            roots = [params["first"] + params["last"]] if pp == 1 else [params["first"], params["last"]]
            units = [params["layer"]] * params["layers"] + [u for u in roots if u]
            gathers = m + 1 if zero == 3 else 1
            for u in units:
                add("dp", "all_gather", gathers, u * weight_bytes)
                add("dp", "reduce_scatter", 1, u * g_b)
        else:
            padded = -(-p_local // dp) * dp if torch_impl else p_local
            if zero == 0:
                add("dp", "all_reduce", 1, padded * g_b)
            elif zero == 1:
                add("dp", "reduce_scatter", 1, padded * g_b)
                add("dp", "all_gather", 1, padded * weight_bytes)
            elif zero == 2:
                add("dp", "reduce_scatter", m, padded * g_b)
                add("dp", "all_gather", 1, padded * weight_bytes)
            else:
                add("dp", "all_gather", 2 * m, padded * weight_bytes)
                add("dp", "reduce_scatter", m, padded * g_b)

    if model.tie_embeddings and pp > 1 and (first or last):
        shard = dp if (torch_impl and zero >= 2 and dp > 1) else 1
        add("embd", "all_reduce", 1, vocab * h / tp / shard * g_b)
    return {k: (int(c), int(round(n))) for k, (c, n) in sorted(out.items())}
