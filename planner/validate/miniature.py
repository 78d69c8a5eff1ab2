"""The run configuration and the prediction for a validation run (no torch here).

``miniature(plan)`` keeps every kind of parallelism the plan uses on a model small enough for 8
CPU ranks: tp, cp, pp, dp each min(plan, 2); vpp 2 if the plan interleaves; an uneven pipeline
split as an uneven 2-stage split; the plan's ZeRO stage (the distributed optimizer runs as
ZeRO-1), recompute and SP; the model's kind (norm, bias, activation, positions, tied embeddings,
GQA); dropout runs as 0. What it maps or cannot keep is listed in ``Run.notes`` /
``Run.not_exercised``, never dropped silently.
``full_scale(plan, K)`` is the plan itself with K layers per pipeline chunk (torchrun on a cluster).
``predict(run, pp_rank)`` is what the cost model says for one rank of that run:
planner.cost.volumes.step_volumes(impl="torch") and planner.cost.memory (stage_params,
model_state_bytes) with the run's element sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..cost import memory
from ..cost.model_flops import padded_vocab
from .torch_volumes import step_volumes
from ..errors import UsageError
from ..layout import Candidates
from ..layout import Layout
from ..specs import ModelSpec, TrainingSpec
from ..plan import Plan
from ..cost.checkpoint import param_groups
from .moe_plan import base_volumes, memory_bytes, moe_degrees, moe_miniature

ELEM_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}
LOSS_RTOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 2e-2}


@dataclass(frozen=True)
class Run:
    """One validation run: the model, training and layout it runs, and how."""

    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    dtype: str = "float64"
    steps: int = 3
    device: str = "cpu"
    seed: int = 1234
    lr: float = 1e-2
    notes: tuple[str, ...] = ()
    not_exercised: tuple[dict, ...] = ()  # {"feature": ..., "reason": ...}

    @property
    def world(self) -> int:
        return self.layout.gpus

    @property
    def elem(self) -> int:
        return ELEM_BYTES[self.dtype]

    def stage_layers(self) -> list[int] | None:
        """Layers per pipeline stage (model chunk) id, or None for the even split.

        Uneven (vpp 1 only): first_stage_layers, the middle stages (L - first - last)/(pp - 2)
        each, last_stage_layers (Megatron's --decoder-first/last-pipeline-num-layers)."""
        lay, n = self.layout, self.model.num_layers
        if not lay.first_stage_layers or lay.vpp > 1:
            return None
        middle = [int(lay.stage_layers(n)[1])]
        return [lay.first_stage_layers] + middle * (lay.pp - 2) + [lay.last_stage_layers]

    def worker_config(self, out_dir: str, timeout_s: int = 120) -> dict:
        """The plain dict every rank receives (planner.validate.worker.run_rank)."""
        m, lay = self.model, self.layout
        return {
            "model": dict(num_layers=m.num_layers, hidden=m.hidden_size, heads=m.num_attention_heads,
                          kv_heads=m.kv_heads, head_dim=m.kv_channels, ffn=m.ffn,
                          vocab=int(padded_vocab(m.vocab_size, lay.tp)), seq=self.training.seq_length,
                          activation=m.activation, norm=m.norm, bias=m.bias,
                          positions=m.position_embedding, tie_embeddings=m.tie_embeddings,
                          mlp_groups=lay.tp, recompute=lay.recompute,
                          max_positions=m.max_position_embeddings or 0, qkv_bias=m.qkv_bias,
                          **_moe_config(m)),
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "vpp": lay.vpp,
            "schedule": lay.pipeline_schedule,
            "ep": lay.ep, "etp": lay.etp,
            "zero": lay.zero_stage, "stage_layers": self.stage_layers(),
            "sp": lay.sequence_parallel, "recompute": lay.recompute, "mbs": lay.micro_batch_size,
            "gbs": self.training.global_batch_size, "steps": self.steps, "dtype": self.dtype,
            "device": self.device, "seed": self.seed, "lr": self.lr, "out_dir": out_dir,
            "timeout_s": timeout_s,
        }


def _moe_config(m: ModelSpec) -> dict:
    """The MoE fields of the validator's GPTConfig (planner.validate.model)."""
    if m.moe is None:
        return {}
    return dict(num_experts=m.moe.num_experts, topk=m.moe.router_topk,
                expert_ffn=m.moe.ffn_hidden_size,
                shared_ffn=m.moe.shared_experts * m.moe.shared_ffn,
                first_dense=m.moe.first_dense_layers)


def _moe_layout(plan: Plan, d: dict, hidden: int) -> tuple[dict, dict, list[str], list[dict]]:
    """(model updates, layout updates, notes, not exercised) of an MoE plan's miniature
    (planner.validate.moe_plan)."""
    lay, m = plan.layout, plan.model
    ep, etp, dropped = moe_degrees(lay, d["tp"] * d["cp"] * d["dp"], m.bias)
    update, left = moe_miniature(m, hidden)
    layout = dict(ep=ep, etp=etp)
    notes = [f"experts: {m.moe.num_experts} run as 4 (top-{update['moe'].router_topk}, width "
             f"{hidden // 2}) on ep' = {ep}, etp' = {etp}"]
    if lay.recompute == "full":
        layout["recompute"] = "none"
        left.append({"feature": "full recompute", "reason": "run as none with experts: the "
                     "recomputed MoE layer's collectives depend on where the checkpoint stops"})
    if lay.zero_stage >= 2:
        layout["zero_stage"] = 1
        left.append({"feature": f"ZeRO-{lay.zero_stage}", "reason": "run as ZeRO-1 with experts "
                     "(expert parameters are not FSDP-wrapped over edp)"})
    if d["tp"] > 1 and not lay.sequence_parallel:
        layout["sequence_parallel"] = True
        notes.append("SP on: Megatron-Core's MoE layer requires it with tp > 1")
    return update, layout, notes, dropped + left


def _mapped(lay: Layout) -> tuple[Layout, list[str]]:
    """The distributed optimizer as ZeRO-1 (what it is in memory and traffic: flat gradient
    reduce-scatter, sharded master + Adam, parameter all-gather; context.cost_view does the same)."""
    if not lay.distributed_optimizer:
        return lay, []
    note = ("distributed_optimizer: run as ZeRO-1 (one flat gradient reduce-scatter, fp master "
            "copy + Adam sharded over dp*cp, one parameter all-gather per step), which is its "
            "memory and traffic")
    return lay.model_copy(update=dict(distributed_optimizer=False,
                                      zero_stage=max(1, lay.zero_stage))), [note]


def _no_dropout(model: ModelSpec) -> list[dict]:
    """The not-exercised entry for a model with dropout (both runs set it to 0: random masks
    would make the losses differ from the single-process reference, and the activation
    prediction then leaves out the masks, memory.activation_bytes' dropout term)."""
    if not model.dropout:
        return []
    return [{"feature": "dropout", "reason": (
        f"dropout {model.dropout:g} run as 0: random masks would break the exact loss "
        f"comparison with the single-process reference; activations predicted without masks")}]


def _no_host_offload(plan: Plan) -> list[dict]:
    """Activation offload and block recompute of N layers are not run: the worker keeps every
    layer's activations on the device (or recomputes every layer), and its predictions are of
    that run."""
    lay, out = plan.layout, []
    if lay.offload_layers:
        out.append({"feature": "activation offload", "reason": (
            f"offload of {lay.offload_layers} layers to host memory is not run: activations "
            "stay on the device, and are predicted so")})
    if lay.recompute_num_layers:
        out.append({"feature": "recompute_num_layers", "reason": (
            f"full recompute of the first {lay.recompute_num_layers} layers per chunk run as "
            "every layer, and predicted so")})
    return out


def _no_fp8(plan: Plan) -> list[dict]:
    """An FP8 plan runs in the validator's dtype: its FP8 terms are not checked."""
    if plan.training.precision == "bf16":
        return []
    return [{"feature": f"precision {plan.training.precision}", "reason": (
        "the validator's torch matmuls run in the run's dtype (Transformer Engine's FP8 is not "
        "emulated): FP8 quantization, weight copies and FP8 gathers are not checked; the run "
        "and its predictions are those of the bf16 plan")}]


def miniature_dims(lay: Layout, world: int) -> tuple[dict[str, int], list[dict]]:
    """Sizes {tp, cp, pp, dp} of the miniature on ``world`` ranks and what that leaves out.

    Each is min(plan, 2). Rule when tp'*cp'*pp'*dp' > world: dp' drops to 1 if cp' = 2 (the
    gradient / ZeRO group is dp*cp, so sharding and gradient reduction over 2 ranks are still
    exercised by the cp ranks, which also hold different tokens); nothing else is ever
    dropped: UsageError naming the ranks needed.
    """
    d = {k: min(getattr(lay, k), 2) for k in ("tp", "cp", "pp", "dp")}
    need = d["tp"] * d["cp"] * d["pp"] * d["dp"]
    dropped: list[dict] = []
    if need > world and d["cp"] > 1 and d["dp"] > 1:
        d["dp"] = 1
        dropped.append({"feature": "dp", "reason": (
            f"dp' = 1: tp*cp*pp*dp = {need} ranks > --world {world}; the gradient/ZeRO group "
            f"dp*cp still has {d['cp']} ranks (the cp ranks); --world {need} keeps dp = 2")})
    got = d["tp"] * d["cp"] * d["pp"] * d["dp"]
    if got > world:
        raise UsageError(f"the miniature of this plan (tp={d['tp']} cp={d['cp']} pp={d['pp']} "
                         f"dp={d['dp']}) needs {got} ranks; --world is {world}")
    return d, dropped


def miniature(plan: Plan, world: int, dtype: str = "float64", steps: int = 3,
              layers_per_stage: int = 1, device: str = "cpu") -> Run:
    """A small run with the plan's kinds of parallelism on ``world`` ranks (UsageError if too few).

    tp', cp', pp', dp' by miniature_dims, vpp' = 2 if vpp > 1; an uneven split (pp' = 2,
    vpp 1) becomes K and K+1 layers (K+1 and K if the plan's first stage is the larger);
    4 heads of 16 per 2 TP ranks (GQA keeps g' = tp' KV heads), hidden 16*heads, ffn 4h (GeLU)
    or 2h (SwiGLU), vocabulary 128*tp' (no padding), sequence 32 (8 tokens per CP chunk at
    cp' = 2), micro-batch min(b, 2), m' = 2*pp' micro-batches.
    """
    lay, m = plan.layout, plan.model
    d, dropped = miniature_dims(lay, world)
    tp, cp, pp, dp = d["tp"], d["cp"], d["pp"], d["dp"]
    vpp = 2 if lay.vpp > 1 else 1
    mapped, notes = _mapped(lay)
    used = tp * cp * pp * dp
    if used < world:  # the miniature's degrees are at most 2 each: more ranks add nothing
        notes.append(f"--world {world}: the miniature needs {used} ranks (tp' {tp} x cp' {cp} x "
                     f"pp' {pp} x dp' {dp}) and runs on {used}")
    k = layers_per_stage
    first = last = 0
    if lay.first_stage_layers or lay.last_stage_layers:
        if vpp > 1:
            dropped.append({"feature": "uneven pipeline split", "reason": (
                "not exercised with interleaving (vpp > 1): the miniature splits evenly")})
        else:
            first, last = (k + 1, k) if lay.first_stage_layers > lay.last_stage_layers else (k, k + 1)
            notes.append(f"uneven pipeline split {lay.split_label} layers: run as {first}+{last} "
                         "on pp' = 2")
    layers = first + last if first else pp * vpp * k
    heads = 2 * max(tp, 2)
    kv = heads if m.kv_heads == m.num_attention_heads or m.attention_kind == "mla" else max(tp, 1)
    hidden = 16 * heads
    ffn = 4 * hidden if m.activation == "gelu" else 2 * hidden
    seq = 32
    moe_update, moe_layout = {}, {}
    if m.moe is not None:
        moe_update, moe_layout, more, left = _moe_layout(plan, d, hidden)
        notes += more
        dropped += left
        if moe_update["moe"].first_dense_layers and layers < 2:
            layers = 2  # the dense first layer and an MoE layer
    mini = m.model_copy(update=dict(
        name=f"{m.name}-miniature", num_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=kv, head_dim=16, ffn_hidden_size=ffn,
        vocab_size=128 * tp, max_position_embeddings=seq if m.position_embedding == "learned" else None,
        dropout=0.0, **moe_update))
    mbs = min(lay.micro_batch_size, 2)
    micro = 2 * pp
    training = plan.training.model_copy(update=dict(seq_length=seq, precision="bf16",
                                                    global_batch_size=dp * mbs * micro))
    schedule, zero, more = _schedule(lay, pp, mapped.zero_stage)  # notes, dropped: in Run
    layout = Layout(**{**dict(tp=tp, cp=cp, pp=pp, dp=dp, zero_stage=zero,
                              micro_batch_size=mbs, recompute=lay.recompute,
                              sequence_parallel=lay.sequence_parallel and tp > 1, vpp=vpp,
                              first_stage_layers=first, last_stage_layers=last),
                       "pipeline_schedule": schedule, **moe_layout})
    return Run(mini, training, layout, dtype=dtype, steps=steps, device=device,
               notes=tuple(notes + more["notes"]), not_exercised=tuple(
                   dropped + more["dropped"] + _no_dropout(m) + _no_fp8(plan) + _no_host_offload(plan)))


# the schedules that split the backward into input and weight gradients (reference §6-§11)
SPLIT_BACKWARD = ("interleaved-zero-bubble", "zbv", "dualpipev")


def _schedule(lay: Layout, pp: int, zero: int) -> tuple[str | None, int, dict]:
    """(the run's pipeline schedule, its ZeRO stage, {"notes", "dropped"}): the plan's schedule
    where torch.distributed.pipelining runs it on pp ranks (worker.SCHEDULE_CLASSES: the op
    order and per-rank peak are then checked, validate.schedule_check); DualPipe has no class
    there, so the run takes what its vpp implies and says so; None (implied) with pp = 1.
    ZeRO ``zero`` >= 2 (the validator's FSDP2) under a split backward runs as ZeRO-1: the gloo
    run of FSDP2 with PyTorch's separate input and weight gradients hangs."""
    out: dict = {"notes": [], "dropped": []}
    if pp == 1 or lay.pipeline_schedule in ("1f1b", "interleaved-1f1b"):
        return None, zero, out
    if lay.pipeline_schedule == "dualpipe":
        out["dropped"].append({"feature": "pipeline schedule dualpipe", "reason": (
            "torch.distributed.pipelining has no DualPipe (bidirectional) schedule: the miniature "
            "runs 1F1B; its op order and peaks are not checked")})
        return None, zero, out
    out["notes"].append(f"pipeline schedule {lay.pipeline_schedule}: run with torch's own class; "
                        "its op order and per-rank peak are checked against the simulator's")
    if lay.pipeline_schedule in SPLIT_BACKWARD and zero >= 2:
        out["dropped"].append({"feature": f"ZeRO-{zero} with {lay.pipeline_schedule}", "reason": (
            "the validator's FSDP2 wrapping does not run PyTorch's split backward (its input "
            "and weight gradients at different times: the gloo run hangs); run with ZeRO-1")})
        zero = 1
    return lay.pipeline_schedule, zero, out


def full_scale(plan: Plan, layers_per_stage: int | None, dtype: str, steps: int, device: str) -> Run:
    """The plan's own shapes and layout (torchrun), optionally with K layers per pipeline chunk."""
    model = plan.model
    layout, notes = _mapped(plan.layout)
    schedule, zero, more = _schedule(layout, layout.pp, layout.zero_stage)
    dropped: list[dict] = more["dropped"]
    if layout.pipeline_schedule == "dualpipe" or zero != layout.zero_stage:  # what runs
        layout = layout.model_copy(update={"pipeline_schedule": schedule or "1f1b",
                                           "zero_stage": zero})
    uneven = bool(layout.first_stage_layers or layout.last_stage_layers)
    if layers_per_stage is not None:
        model = model.model_copy(update=dict(
            num_layers=plan.layout.pp * plan.layout.vpp * layers_per_stage))
        if uneven:
            layout = layout.model_copy(update=dict(first_stage_layers=0, last_stage_layers=0))
            dropped.append({"feature": "uneven pipeline split",
                            "reason": "--layers-per-stage runs an even split"})
    elif uneven and layout.vpp > 1:
        raise UsageError("an uneven pipeline split with vpp > 1 cannot be run")
    if not uneven or layers_per_stage is not None:
        if model.num_layers % (plan.layout.pp * plan.layout.vpp):
            raise UsageError(f"{model.num_layers} layers do not split into pp*vpp = "
                             f"{plan.layout.pp * plan.layout.vpp} chunks")
    layout = layout.model_copy(update=dict(offload_layers=0, recompute_num_layers=0))
    return Run(model.model_copy(update=dict(dropout=0.0)),
               plan.training.model_copy(update={"precision": "bf16"}), layout,
               dtype=dtype, steps=steps, device=device, notes=tuple(notes),
               not_exercised=tuple(dropped + _no_dropout(plan.model) + _no_fp8(plan)
                                   + _no_host_offload(plan)))


def predict(run: Run, pp_rank: int) -> dict:
    """Predicted per-step volumes and model-state bytes of one rank at pipeline rank ``pp_rank``.

    Memory: memory.rank_params (the rank's layers, embedding on rank 0, head on the last) and
    memory.model_state_bytes, rescaled from its bf16/fp32-Adam bytes to the run's element size e:
    weights x e/2, gradients x e/grad_bytes, optimizer x k/12 with k = 3e (flat fp master copy +
    Adam m, v: ZeRO-0/1) or 2e (Adam m, v on FSDP2's sharded parameters: ZeRO-2/3). FSDP2's
    ZeRO-2 keeps only the parameter shard between steps, so its weights follow stage 3's formula.
    With context parallel the sharding group is dp*cp (formulas.md 5.7; LayoutDegrees.grad_group).
    """
    lay, e = run.layout, run.elem
    if run.model.moe is not None:
        return {"memory": memory_bytes(run, pp_rank), "comm": base_volumes(run, pp_rank, e)}
    c = Candidates.from_layouts([lay])
    p = memory.rank_params(run.model, c, pp_rank)
    params = memory.non_expert_params(p)
    fsdp = lay.zero_stage >= 2 and lay.grad_group > 1
    # the miniature's own torch code holds Megatron's accounting, whatever framework the plan is for
    # (flat fp master copy and fp Adam moments, all on the GPU: bf16 moments or optimizer offload
    # of the plan's framework are not what its torch Adam keeps)
    training = run.training.model_copy(update=dict(param_bytes=2, master_weights=True,
                                                   fp32_grad_partition=False,
                                                   pp_unsharded_params=False,
                                                   optimizer_moment_bytes=4,
                                                   optimizer_offload_fraction=0.0))
    states = memory.model_state_bytes(params, c, training)
    weights = memory.model_state_bytes(params, replace(c, zero_stage=np.array([3])), training) \
        ["weights"] if fsdp else states["weights"]
    k = 2 * e if fsdp else 3 * e
    mem = {"params_bytes": float(weights[0]) * e / 2,
           "grads_bytes": float(states["gradients"][0]) * e / run.training.grad_bytes,
           "optimizer_bytes": float(states["optimizer"][0]) * k / memory.OPTIMIZER_BYTES_PER_PARAM}
    comm = step_volumes(run.model, run.training, lay, pp_rank, impl="torch", act_bytes=e,
                        weight_bytes=e, grad_bytes=e)
    return {"memory": mem, "checkpoint": checkpoint_bytes(run, c, pp_rank, fsdp),
            "comm": {f"{g}:{k_}": [c_, b_] for (g, k_), (c_, b_) in comm.items()}}


def checkpoint_bytes(run: Run, c, pp_rank: int, fsdp: bool) -> dict[int, int]:
    """{tp rank: bytes} one GPU of pipeline rank ``pp_rank`` writes to the validator's DCP
    checkpoint (validate.checkpoint), from cost.checkpoint.param_groups: per group of equal
    spread and stride, ceil(params / spread) elements of each tensor kind the run keeps, at
    the run's element size e: weights, a master copy (ZeRO-0/1's flat optimizer; FSDP2 updates
    the parameters themselves) and Adam's two moments, i.e. 4e or 3e per element."""
    kinds = 3 if fsdp else 4
    merged: dict[tuple[float, float], float] = {}
    for g in param_groups(run.model, c, pp_rank):
        key = (float(np.ravel(g.spread)[0]), float(np.ravel(g.stride)[0]))
        merged[key] = merged.get(key, 0.0) + float(np.ravel(g.params)[0])
    out = {}
    for t in range(run.layout.tp):
        out[t] = sum(math.ceil(round(params) / spread) * kinds * run.elem
                     for (spread, stride), params in merged.items() if t % stride == 0)
    return out
