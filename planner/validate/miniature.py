"""The run configuration and the prediction for a validation run (no torch here).

``miniature(plan)`` keeps every kind of parallelism the plan uses on a model small enough for 8
CPU ranks: tp, pp, dp each min(plan, 2); vpp 2 if the plan interleaves; the plan's ZeRO stage,
recompute and SP; the model's kind (norm, bias, activation, positions, tied embeddings, GQA).
``full_scale(plan, K)`` is the plan itself with K layers per pipeline chunk (torchrun on a cluster).
``predict(run, pp_rank)`` is what the cost model says for one rank of that run:
planner.cost.volumes.step_volumes(impl="torch") and planner.cost.memory (stage_params,
model_state_bytes) with the run's element sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import memory
from ..cost.volumes import step_volumes
from ..errors import UsageError
from ..space import Candidates
from ..specs import Layout, ModelSpec, Plan, TrainingSpec, padded_vocab

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

    @property
    def world(self) -> int:
        return self.layout.gpus

    @property
    def elem(self) -> int:
        return ELEM_BYTES[self.dtype]

    def worker_config(self, out_dir: str, timeout_s: int = 120) -> dict:
        """The plain dict every rank receives (planner.validate.worker.run_rank)."""
        m, lay = self.model, self.layout
        return {
            "model": dict(num_layers=m.num_layers, hidden=m.hidden_size, heads=m.num_attention_heads,
                          kv_heads=m.kv_heads, head_dim=m.kv_channels, ffn=m.ffn,
                          vocab=padded_vocab(m.vocab_size, lay.tp), seq=self.training.seq_length,
                          activation=m.activation, norm=m.norm, bias=m.bias,
                          positions=m.position_embedding, tie_embeddings=m.tie_embeddings,
                          mlp_groups=lay.tp, recompute=lay.recompute,
                          max_positions=m.max_position_embeddings or 0),
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "vpp": lay.vpp, "zero": lay.zero_stage,
            "sp": lay.sequence_parallel, "recompute": lay.recompute, "mbs": lay.micro_batch_size,
            "gbs": self.training.global_batch_size, "steps": self.steps, "dtype": self.dtype,
            "device": self.device, "seed": self.seed, "lr": self.lr, "out_dir": out_dir,
            "timeout_s": timeout_s,
        }


def miniature(plan: Plan, world: int, dtype: str = "float64", steps: int = 3,
              layers_per_stage: int = 1, device: str = "cpu") -> Run:
    """A small run with the plan's kinds of parallelism on ``world`` ranks (UsageError if too few).

    tp' = min(tp, 2), pp' = min(pp, 2), dp' = min(dp, 2), vpp' = 2 if vpp > 1; 4 heads of 16 per
    2 TP ranks (GQA keeps g' = tp' KV heads), hidden 16*heads, ffn 4h (GeLU) or 2h (SwiGLU),
    vocabulary 128*tp' (no padding), sequence 32, micro-batch min(b, 2), m' = 2*pp' micro-batches.
    """
    lay, m = plan.layout, plan.model
    tp, pp, dp = min(lay.tp, 2), min(lay.pp, 2), min(lay.dp, 2)
    vpp = 2 if lay.vpp > 1 else 1
    if tp * pp * dp > world:
        raise UsageError(f"the miniature of this plan (tp={tp} pp={pp} dp={dp}) needs "
                         f"{tp * pp * dp} ranks; --world is {world}")
    heads = 2 * max(tp, 2)
    kv = heads if m.kv_heads == m.num_attention_heads else max(tp, 1)
    hidden = 16 * heads
    ffn = 4 * hidden if m.activation == "gelu" else 2 * hidden
    seq = 32
    mini = m.model_copy(update=dict(
        name=f"{m.name}-miniature", num_layers=pp * vpp * layers_per_stage, hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=kv, head_dim=16, ffn_hidden_size=ffn,
        vocab_size=128 * tp, max_position_embeddings=seq if m.position_embedding == "learned" else None,
        dropout=0.0))
    mbs = min(lay.micro_batch_size, 2)
    micro = 2 * pp
    training = plan.training.model_copy(update=dict(seq_length=seq,
                                                    global_batch_size=dp * mbs * micro))
    layout = Layout(tp=tp, pp=pp, dp=dp, zero_stage=lay.zero_stage, micro_batch_size=mbs,
                    recompute=lay.recompute, sequence_parallel=lay.sequence_parallel and tp > 1,
                    vpp=vpp)
    return Run(mini, training, layout, dtype=dtype, steps=steps, device=device)


def full_scale(plan: Plan, layers_per_stage: int | None, dtype: str, steps: int, device: str) -> Run:
    """The plan's own shapes and layout (torchrun), optionally with K layers per pipeline chunk."""
    model = plan.model
    if layers_per_stage is not None:
        model = model.model_copy(update=dict(
            num_layers=plan.layout.pp * plan.layout.vpp * layers_per_stage))
    if model.num_layers % (plan.layout.pp * plan.layout.vpp):
        raise UsageError(f"{model.num_layers} layers do not split into pp*vpp = "
                         f"{plan.layout.pp * plan.layout.vpp} chunks")
    return Run(model.model_copy(update=dict(dropout=0.0)), plan.training, plan.layout,
               dtype=dtype, steps=steps, device=device)


def predict(run: Run, pp_rank: int) -> dict:
    """Predicted per-step volumes and model-state bytes of one rank at pipeline rank ``pp_rank``.

    Memory: memory.stage_params (first/last stage; middle ranks hold only layers) and
    memory.model_state_bytes, rescaled from its bf16/fp32-Adam bytes to the run's element size e:
    weights x e/2, gradients x e/grad_bytes, optimizer x k/12 with k = 3e (flat fp master copy +
    Adam m, v: ZeRO-0/1) or 2e (Adam m, v on FSDP2's sharded parameters: ZeRO-2/3). FSDP2's
    ZeRO-2 keeps only the parameter shard between steps, so its weights follow stage 3's formula.
    """
    lay, e = run.layout, run.elem
    c = Candidates.from_layouts([lay])
    stage = "first" if pp_rank == 0 else "last" if pp_rank == lay.pp - 1 else None
    if stage is None:
        from ..cost import flops
        sharded, replicated = flops.layer_params_per_gpu(run.model, c.tp)
        params = run.model.num_layers / c.pp * (sharded + replicated)
    else:
        params = memory.stage_params(run.model, c, stage)
    fsdp = lay.zero_stage >= 2 and lay.dp > 1
    states = memory.model_state_bytes(params, c.zero_stage, c.dp, run.training)
    weights = memory.model_state_bytes(params, np.array([3 if fsdp else lay.zero_stage]), c.dp,
                                       run.training)["weights"]
    k = 2 * e if fsdp else 3 * e
    mem = {"params_bytes": float(weights[0]) * e / 2,
           "grads_bytes": float(states["gradients"][0]) * e / run.training.grad_bytes,
           "optimizer_bytes": float(states["optimizer"][0]) * k / memory.OPTIMIZER_BYTES_PER_PARAM}
    act_stage = "last" if stage == "last" else "first"
    act = float(memory.activation_bytes(run.model, run.training, c, act_stage)[0]) * e / 2
    comm = step_volumes(run.model, run.training, lay, pp_rank, impl="torch", act_bytes=e,
                        weight_bytes=e, grad_bytes=e)
    return {"memory": mem, "activations": act,
            "comm": {f"{g}:{k_}": [c_, b_] for (g, k_), (c_, b_) in comm.items()}}
