"""The activation check: bytes saved for backward per pipeline rank, plan formula + torch deltas.

Measured (instrument.SavedBytes): the peak over the last step of the bytes autograd holds for
backward on one rank (parameters excluded, deduplicated by storage), including what a
recomputation holds during its backward. This is what formulas.md section 3 models, without the
transient buffers (FSDP2's gathered weights, gradients being reduced, the all-gathered logits,
optimizer temporaries) that dominate a miniature's live-tensor peak.

Predicted = the plan's formula on the miniature (``predicted_activations``, the only call into
planner.cost) + named torch deltas (``torch_deltas``): what the validator's PyTorch model
saves differently from Megatron-Core, each with its size. The deltas are derived for the CPU
kernels the miniature runs (float64/float32, PyTorch's CPU flash-attention kernel).

Sizes below (bytes; T = b*s/cp local tokens of one micro-batch, e the run's element size,
t = tp, a_l = a/t, g_l = max(g, t)/t, f_l = f/t, V the padded vocabulary, SP divides the
sequence-sharded terms by t).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..layout import Candidates
from ..cost.blocks import kv_heads_per_rank
from ..cost.model_flops import padded_vocab
from ..cost import memory, pipeline
from ..specs import TrainingSpec
from .miniature import SPLIT_BACKWARD

# Every layout tried (13 miniatures, 24 pipeline ranks: 1F1B, interleaved, uneven split, CP,
# SP, ZeRO-0..3, no / selective / full recompute, GPT-3 and Llama kinds, float64 and float32)
# matched to the byte. 1% is half the model-state tolerance: it leaves room for a small tensor
# a torch release starts saving (a norm statistic is 1/h of a hidden state) and still fails
# an error in any term that matters (a halved formula misses by 30% or more on each of them).
ACT_RTOL = 0.01

DELTAS = {  # name -> what torch saves differently (sizes: the functions below, formulas.md 3.9)
    "norms": "norm statistics (mean, rstd) and unfused RMSNorm's normalized input are saved too",
    "sp gathered inputs": "with SP the QKV, fc1 and output-layer GEMMs save the all-gathered "
                          "input (Megatron: the 1/t shard, re-gathered in backward)",
    "swiglu gate": "unfused SwiGLU also saves silu(gate), f/t*e per token",
    "rope tables": "RoPE cos and sin tables for q and for k in every layer, 4*(s/cp)*d_h*e",
    "cp mask": "the CP attention mask by global position, as a float (s/cp)*s*e tensor",
    "gqa kv repeat": "K and V repeated to the query heads before attention",
    "cp gathered kv": "CP all-gather form: K and V of the whole sequence (Megatron's ring keeps "
                      "the local chunk)",
    "attention kernel": "the CPU flash kernel's e-byte log-sum-exp in place of the formula's "
                        "fp32 one (or score matrix without flash attention)",
    "core attention recompute": "selective recompute: the recomputed core attention beyond the "
                                "MLP tensors freed before it (not in the formula)",
    "recompute input shared": "full recompute: the recomputed layer's input is the stored one "
                              "(the formula counts it twice)",
    "recompute after loss": "last stage: the loss and output-layer tensors are freed before the "
                            "recomputation (the formula adds both)",
    "loss": "log-softmax of the all-gathered logits (V*e per token) in place of Megatron's bf16 "
            "logits + fp32 softmax of V/t",
    "token ids": "int64 ids are 8 B whatever e; interleaved 1F1B holds more micro-batches' ids "
                 "than the formula counts (first_chunk_microbatches)",
    "cp positions": "learned positions under CP: the int64 index of the rank's positions",
}


def predicted_activations(run, pp_rank: int) -> dict:
    """The plan's activation formula on one pipeline rank of ``run``: the validator's only
    call into the cost model's activation terms (formulas.md 3.2-3.6).

    Returns bytes at the run's element size e (the formula's bf16 bytes x e/2):
    "bytes": memory.activation_bytes_by_stage of the rank (its in-flight layers x its per-layer
    bytes, the full-recompute working set, and rank 0's / the last rank's edge buffers);
    "inflight_layers": pipeline.inflight_layers of rank r (its own chunk sizes);
    "first_microbatches": the micro-batches whose token ids the formula holds on rank 0
    (pipeline.inflight_first_chunk); "layer_bytes": activation_per_layer without recompute,
    the formula's full-recompute working set.
    """
    lay, model = run.layout, run.model
    training = megatron_loss(run.training)
    c = Candidates.from_layouts([lay])
    m = c.num_microbatches(training.global_batch_size)
    layers = float(pipeline.inflight_layers(c, model.num_layers, m, pp_rank)[0])
    layer = float(memory.activation_per_layer(model, training, c, np.zeros_like(c.recompute))[0])
    total = float(memory.activation_bytes_by_stage(model, training, c, ranks={"rank": np.array([pp_rank])})
                  ["rank"][0])
    first_mb = float(pipeline.inflight_first_chunk(c, m, 0)[0])
    e = run.elem / 2
    return {"bytes": total * e, "inflight_layers": layers, "first_microbatches": first_mb,
            "layer_bytes": layer * e}


def megatron_loss(training):
    """``training`` with Megatron's loss accounting (TrainingSpec's defaults: bf16 logits and an
    fp32 softmax, 6 B per logit, not in place), which the miniature's torch loss holds whatever
    framework the plan is for (as its model states follow Megatron's: miniature.predicted); a
    torchtitan plan's fp32 loss (12 B per logit) would otherwise be compared with it."""
    fields = TrainingSpec.model_fields
    return training.model_copy(update={k: fields[k].default for k in
                                       ("loss_bytes_per_logit", "cross_entropy_in_place",
                                        "loss_chunks")})


def _dims(run) -> SimpleNamespace:
    m, lay, tr = run.model, run.layout, run.training
    t, cp, b, s = lay.tp, lay.cp, lay.micro_batch_size, tr.seq_length
    return SimpleNamespace(
        t=t, cp=cp, b=b, s=s, T=b * s / cp, e=run.elem, h=m.hidden_size, d=m.kv_channels,
        a_l=m.num_attention_heads / t, g_l=float(kv_heads_per_rank(m, t)), f_l=m.ffn / t,
        V=int(padded_vocab(m.vocab_size, t)), sp=t if lay.sequence_parallel else 1,
        rope=m.position_embedding == "rope", swiglu=m.activation == "swiglu",
        rms=m.norm == "rmsnorm", flash=tr.flash_attention)


def _norm(k) -> float:
    """Statistics (and RMSNorm's normalized input) one norm saves for one micro-batch."""
    return k.T / k.sp * k.e * ((k.h + 1) if k.rms else 2)


def _core(k) -> dict[str, float]:
    """torch - plan bytes of the attention core of one layer, one micro-batch, stored."""
    plan_scores = 2 * k.a_l * k.T * k.e if k.flash else k.a_l * k.s * k.T * k.e
    return {"rope tables": 4 * k.s / k.cp * k.d * k.e if k.rope else 0.0,
            "cp mask": k.s / k.cp * k.s * k.e if k.cp > 1 else 0.0,
            "gqa kv repeat": 2 * k.b * k.s * (k.a_l - k.g_l) * k.d * k.e,
            "cp gathered kv": 2 * k.b * (k.s - k.s / k.cp) * k.g_l * k.d * k.e,
            "attention kernel": k.a_l * k.T * k.e - plan_scores}


def layer_deltas(run, mode: str) -> dict[str, float]:
    """torch - plan bytes of ONE layer for ONE micro-batch saved with recompute ``mode``
    ("none" or "selective"; a fully recomputed layer stores only its input, as planned)."""
    k = _dims(run)
    out = {"norms": 2 * _norm(k),
           "sp gathered inputs": 2 * k.T * k.h * k.e * (1 - 1 / k.sp),
           "swiglu gate": k.T * k.f_l * k.e if k.swiglu else 0.0}
    if mode == "selective":  # the core's input (QKV) and output are saved, as planned
        out["attention kernel"] = -2 * k.a_l * k.T * k.e if k.flash else 0.0
    else:
        out.update(_core(k))
    return out


def core_working_bytes(run) -> float:
    """Bytes by which the recomputed core attention of one micro-batch (selective recompute)
    raises the saved bytes: q and output T*a_l*d_h*e each, K and V b*s*a_l*d_h*e each,
    log-sum-exp, tables and mask, less what the layer's backward has freed before it reaches
    the core (the tail: output-projection input, second norm, MLP input and activations);
    never below 0."""
    k = _dims(run)
    core = _core(k)
    held = (2 * k.T * k.a_l * k.d * k.e + 2 * k.b * k.s * k.a_l * k.d * k.e + k.a_l * k.T * k.e
            + core["rope tables"] + core["cp mask"])
    mlp = (4 if k.swiglu else 2) * k.f_l
    tail = k.T * k.e * (k.a_l * k.d + k.h / k.sp + k.h + mlp) + _norm(k)
    return max(0.0, held - tail)


def last_edge_deltas(run) -> dict[str, float]:
    """torch - plan bytes of the last stage's final norm, output layer and loss (one
    micro-batch)."""
    k = _dims(run)
    return {"norms": _norm(k), "sp gathered inputs": k.T * k.h * k.e * (1 - 1 / k.sp),
            "loss": k.T * k.V * k.e + 8 * k.T + k.e - 3 * k.T * k.V / k.t * k.e}


def _last_edge_bytes(run) -> float:
    """What torch saves on the last stage for one micro-batch: final-norm input and statistics,
    the output layer's input (all-gathered with SP), log-softmax, int64 targets, a scalar."""
    k = _dims(run)
    return k.T / k.sp * k.h * k.e + _norm(k) + k.T * k.h * k.e + k.T * k.V * k.e + 8 * k.T + k.e


def torch_deltas(run, pp_rank: int, plan: dict) -> list[dict]:
    """The named deltas of one pipeline rank: [{"name", "bytes", "count", "each"}], bytes =
    count x each (count: in-flight layers, in-flight micro-batches or 1). ``plan`` is
    predicted_activations(run, pp_rank). Prediction = plan["bytes"] + sum of the bytes."""
    lay, k = run.layout, _dims(run)
    rows: list[tuple[str, float, float]] = []
    stored = "selective" if lay.recompute == "selective" else "none"
    if lay.recompute != "full":
        rows += [(n, plan["inflight_layers"], v) for n, v in layer_deltas(run, stored).items()]
    working = 0.0
    if lay.recompute == "full":  # one layer recomputed in backward: as without recompute
        layer = layer_deltas(run, "none")
        rows += [(n, 1.0, v) for n, v in layer.items()]
        shared = k.T * k.h * k.e / k.sp
        rows.append(("recompute input shared", 1.0, -shared))
        working = plan["layer_bytes"] + sum(layer.values()) - shared
    elif lay.recompute == "selective":
        working = core_working_bytes(run)
        rows.append(("core attention recompute", 1.0, working))  # often 0: see the function
    if pp_rank == 0:
        m = int(lay.num_microbatches(run.training.global_batch_size))
        held = first_chunk_microbatches(lay.pp, lay.vpp, m)
        rows.append(("token ids", 1.0, 8 * k.T * (held - plan["first_microbatches"] * k.e / 2)))
        if run.model.position_embedding == "learned" and k.cp > 1:
            rows.append(("cp positions", 1.0, 8 * k.s / k.cp))
    if pp_rank == lay.pp - 1:
        rows += [(n, 1.0, v) for n, v in last_edge_deltas(run).items()]
        if working:
            rows.append(("recompute after loss", 1.0, -min(_last_edge_bytes(run), working)))
    merged: dict[str, dict] = {}
    for name, count, each in rows:
        if each:
            row = merged.setdefault(name, {"name": name, "bytes": 0.0, "count": count,
                                           "each": each})
            if row["bytes"]:  # the same delta from two places (layers and the last stage)
                row["count"], row["each"] = None, None
            row["bytes"] += count * each
    return list(merged.values())


def predict_saved(run, pp_rank: int) -> dict:
    """Predicted saved-activation peak of one rank at pipeline rank ``pp_rank``, bytes:
    {"predicted": formula + deltas, "formula": predicted_activations' bytes, "deltas":
    torch_deltas}."""
    plan = predicted_activations(run, pp_rank)
    deltas = torch_deltas(run, pp_rank, plan)
    return {"predicted": plan["bytes"] + sum(d["bytes"] for d in deltas),
            "formula": plan["bytes"], "deltas": deltas}


def activation_check(run, pp_rank: int, ranks: list[dict]) -> dict:
    """The ``activations pp<r>`` check: the worst rank's saved-activation peak of the last step
    (record "saved_peak") against predict_saved, relative tolerance ACT_RTOL. The deltas are
    derived for the CPU kernels in float64/float32; on a GPU or in bfloat16 (fp32 LSE and
    loss) they do not hold, and where a rank could not count recomputed tensors
    (SavedBytes.recompute_tracked False) the measurement is short; an MoE model's routed
    activations are not in memory.activation_bytes (formulas.md 3) yet: the check then comes back
    with ``"passed": None`` and compare reports it instead of checking it."""
    pred = predict_saved(run, pp_rank)
    want = pred["predicted"]
    seen = [r["saved_peak"][-1] for r in ranks]
    worst = max(seen, key=lambda v: abs(v - want))
    rel = abs(worst - want) / max(want, 1.0)
    why = ("the deltas are derived for the CPU kernels in float64/float32"
           if run.device != "cpu" or run.dtype not in ("float64", "float32") else
           "a rank could not count its recomputed tensors"
           if not all(r.get("recompute_tracked", True) for r in ranks) else
           "the miniature's routed tensors (permuted rows, probabilities, routing maps) are saved "
           "as its torch code routes them, not as Megatron-Core's MoE layer the plan costs"
           if run.model.moe is not None else
           f"the named torch deltas are derived for the orders of 1F1B and interleaved 1F1B; "
           f"{run.layout.pipeline_schedule} is checked by its op order and per-rank peak "
           "(schedule order / schedule peak)" + (
               "; PyTorch's split backward (stage_backward_input, retain_graph) also keeps a "
               "chunk's autograd graph from its input to its weight gradient, not the weight "
               "GEMMs' share gamma the cost model holds (memory.deferred_w_fraction)"
               if run.layout.pipeline_schedule in SPLIT_BACKWARD else "")
           if run.layout.pp > 1 and run.layout.pipeline_schedule not in ("1f1b", "interleaved-1f1b")
           else None)
    return {"name": f"activations pp{pp_rank}", "measured": worst, "predicted": want,
            "passed": rel <= ACT_RTOL if why is None else None,
            "tolerance": ACT_RTOL, "rel_diff": rel, "formula": pred["formula"],
            "deltas": pred["deltas"],
            "note": None if why is None else f"reported, not checked: {why}"}


def delta_notes(checks: list[dict]) -> list[str]:
    """One note per named delta: its size on each pipeline rank and what it is (DELTAS)."""
    sizes: dict[str, list[str]] = {}
    for c in checks:
        rank = c["name"].split()[-1]
        for d in c["deltas"]:
            each = f" ({d['count']:g} x {d['each']:,.0f})" if d["count"] is not None else ""
            sizes.setdefault(d["name"], []).append(f"{rank} {d['bytes']:+,.0f} B{each}")
    return [f"activation delta '{name}': {', '.join(v)}: {DELTAS[name]}"
            for name, v in sizes.items()]


def first_chunk_microbatches(pp: int, vpp: int, m: int) -> int:
    """Micro-batches whose first model chunk is in flight on pipeline rank 0 at the moment the
    most chunks are, in torch's interleaved 1F1B order (ScheduleInterleaved1F1B, micro-batch
    group pp: (vpp-1)*pp + 2*(pp-1) warm-up forwards, then one forward and one backward per
    step; forward op i runs chunk (i // pp) % vpp, backward op j chunk vpp-1 - (j // pp) % vpp,
    the order of Megatron's get_pp_rank_microbatches). pp=2, vpp=2, m=4: 0F0 0F1 2F0 2F1 0F2
    2B0 0F3 holds five chunks, four of them first chunks: 4. vpp = 1: min(pp, m)."""
    if vpp == 1:
        return min(pp, m)
    total = m * vpp
    warm = min((vpp - 1) * pp + 2 * (pp - 1), total)
    ops = [("F", i) for i in range(warm)]
    for j in range(total - warm):
        ops += [("F", warm + j), ("B", j)]
    ops += [("B", j) for j in range(total - warm, total)]
    held, best = [0] * vpp, (0, 0)
    for kind, i in ops:
        chunk = (i // pp) % vpp
        if kind == "F":
            held[chunk] += 1
        else:
            held[vpp - 1 - chunk] -= 1
        best = max(best, (sum(held), held[0]))
    return best[1]
