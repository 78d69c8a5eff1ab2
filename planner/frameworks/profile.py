"""A TrainingSpec from (the job, a framework profile, the user's overrides): the one place where
a framework's facts enter the cost model.

The job is what is trained (sequence length, global batch, token budget, dtype); the profile
(planner.framework_spec) says how the framework runs it (flash attention, overlaps, p2p style,
ZeRO-3 gathers, gradient dtype, memory accounting, reserve); overrides change single facts for
one run (``--no-flash-attention``, ``--grad-dtype``, ``--allocator-reserve``). The cost functions
read every fact from the TrainingSpec this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..specs import TrainingSpec

JOB_FIELDS = ("seq_length", "global_batch_size", "tokens", "dtype")
GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
RUNTIME_FACTS = ("flash_attention", "tp_backward_overlap", "overlap_grad_reduce", "overlap_p2p_comm",
                 "p2p_scatter_gather", "zero3_gather_unit", "zero3_throughput", "fp8_library",
                 "selective_recompute", "moe_unfused_bias_glu")
# TrainingSpec fields a profile sets (resolve_training); the rest are the job's
FRAMEWORK_FACTS = RUNTIME_FACTS + ("framework", "grad_bytes", "param_bytes", "master_weights",
                                   "fp32_grad_partition", "pp_unsharded_params", "loss_bytes_per_logit",
                                   "loss_chunks", "reserve_runtime",
                                   "reserve_per_communicator", "reserve_allocator")


@dataclass(frozen=True)
class Overrides:
    """Single facts set for one run over the profile's (None = the profile's).

    ``flash_attention``: bool; ``grad_dtype``: fp32 | bf16 | fp16 (the gradient accumulation and
    reduction dtype); ``allocator_reserve``: the allocator's fraction of the working set, >= 0."""

    flash_attention: bool | None = None
    grad_dtype: str | None = None
    allocator_reserve: float | None = None

    def given(self) -> dict[str, Any]:
        """The overrides that are set, by name."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def grad_dtype(profile: FrameworkProfile, dtype: str, overrides: Overrides | None = None) -> str:
    """The gradient dtype of a run: the override, else the profile's for the training ``dtype``
    (bf16 | fp16). UsageError for an unknown override."""
    chosen = overrides.grad_dtype if overrides and overrides.grad_dtype else profile.memory.gradients[dtype]
    if chosen not in GRAD_BYTES:
        raise UsageError(f"--grad-dtype must be fp32 or bf16, got {chosen!r}")
    return chosen


def resolve_training(job: TrainingSpec | dict[str, Any], profile: FrameworkProfile,
                     overrides: Overrides | None = None) -> TrainingSpec:
    """The TrainingSpec of ``job`` run by ``profile`` with ``overrides``.

    ``job``: a TrainingSpec (every field but the FRAMEWORK_FACTS is kept: the batch, the
    precision, MoE routing, checkpoints) or a mapping with seq_length, global_batch_size and
    optionally tokens and dtype (default bf16). Every framework fact of
    TrainingSpec (runtime, memory accounting, reserve) comes from the profile, then the
    overrides. UsageError for a dtype the framework does not train in, or a bad override."""
    if isinstance(job, TrainingSpec):  # every choice of the job's own is kept
        data = job.model_dump(mode="json")
        base = {k: v for k, v in data.items() if k not in FRAMEWORK_FACTS and v is not None}
    else:
        data = dict(job)
        base = {k: data[k] for k in JOB_FIELDS if data.get(k) is not None}
    dtype = base.setdefault("dtype", "bf16")
    if dtype not in profile.rules.dtypes:
        raise UsageError(f"{profile.display} does not train in {dtype} (it takes "
                         f"{', '.join(profile.rules.dtypes)})")
    overrides = overrides or Overrides()
    rt, mem, res = profile.runtime, profile.memory, profile.reserve
    facts: dict[str, Any] = {k: getattr(rt, k) for k in RUNTIME_FACTS}
    facts.update(
        framework=profile.name, grad_bytes=GRAD_BYTES[grad_dtype(profile, dtype, overrides)],
        param_bytes=mem.param_bytes, master_weights=mem.master_weights,
        fp32_grad_partition=mem.fp32_grad_partition, pp_unsharded_params=mem.pp_unsharded_params,
        loss_bytes_per_logit=mem.loss_bytes_per_logit, loss_chunks=mem.loss_chunks,
        reserve_runtime=res.runtime, reserve_per_communicator=res.per_communicator,
        reserve_allocator=res.allocator)
    if overrides.flash_attention is not None:
        facts["flash_attention"] = overrides.flash_attention
    if overrides.allocator_reserve is not None:
        if not 0.0 <= overrides.allocator_reserve <= 2.0:
            raise UsageError(f"--allocator-reserve must be between 0 and 2 (a fraction of the "
                             f"working set), got {overrides.allocator_reserve:g}")
        facts["reserve_allocator"] = float(overrides.allocator_reserve)
    return TrainingSpec.model_validate({**base, **facts})


def gradient_dtype_name(training: TrainingSpec) -> str:
    """The gradient dtype of a resolved TrainingSpec, for printing: fp32, or the 16-bit dtype."""
    return "fp32" if training.grad_bytes == 4 else ("fp16" if training.dtype == "fp16" else "bf16")
