"""Checkpoint size per rank, save and load times, and what failures cost (formulas.md 12).

Format (formulas.md 12.1). Megatron-Core's distributed checkpoint (``--ckpt-format torch_dist``;
``fsdp_dtensor`` under Megatron-FSDP) holds the model weights in the training dtype and, per
parameter, the optimizer's fp32 main copy and Adam's ``exp_avg`` and ``exp_avg_sq``: 2 + 4 + 4
+ 4 = 14 B per parameter in bf16, whatever the ZeRO stage (Megatron-LM @ d98e8a64ddf3
``megatron/core/optimizer/distrib_optimizer.py`` ``_get_main_param_and_optimizer_states``;
BLOOM's 176B checkpoint, "fp32 optim states and bf16+fp32 weights", was 2.3 TB, 14 B per
parameter: bigscience ``train/tr11-176B-ml/README.md``). Gradients are not saved.

Who writes what (formulas.md 12.2). Each piece of state is written exactly once, and the writes
of a piece held by several GPUs are spread evenly over them: Megatron-Core's fully parallel
save (on by default; ``--no-ckpt-fully-parallel-save`` turns it off) spreads the writes of
replicated tensors over the dp*cp group (``megatron/training/checkpointing.py``), the
distributed optimizer and ZeRO-2/3 shard the optimizer (and weights) over the same group, and
torch DCP de-duplicates replicas across ranks (``torch/distributed/checkpoint/
_dedup_save_plans.py``). So one GPU writes its share of each *parameter group*: the parameters
one GPU holds of the group, divided by the GPUs that share its writes (``spread``), if the GPU's
copy is the one written (tensor-parallel replicas: only the copy on TP rank 0, Megatron-Core's
main replica). Groups today (``param_groups``):

- ``tp-sharded``: TP-split weights (QKV, output projection, MLP, column biases, the
  vocab-parallel embedding and output layer), spread over dp*cp, written by every GPU;
- ``tp-replicated``: norms, row-parallel output biases and learned positions, identical on the
  tp ranks, spread over dp*cp, written by TP rank 0's GPUs only (``stride`` = tp).

The output layer's copy of tied embeddings on the last pipeline rank (pp > 1) is a replica of
rank 0's embedding and is not written. Where tp exceeds the KV heads Megatron-Core replicates K/V
heads; blocks.block_params counts those weights per GPU and they are written as TP-sharded
state (a small overcount, one head's K/V per extra TP rank).

Expert parameters (MoE: ep, etp, edp, planner.cost.moe) are one more ParamGroup per pipeline
rank (tests/test_checkpoint.py checks every expert is written once): ``params`` = the expert weights one GPU holds (its (etp, ep) coordinate's experts),
``spread`` = LayoutDegrees.edp (the expert-data-parallel replicas share the writes; Megatron-Core
``--ckpt-fully-parallel-save-process-group ep_dp``), ``stride`` = 1 (every GPU holds a distinct
(etp, ep, edp) coordinate, so every GPU writes); the non-expert groups then hold only the dense
parameters. Nothing else changes: rank_bytes and stage_bytes sum the groups.

Megatron-Core's default optimizer format (``dp_reshardable``) differs from this in two small
ways: it writes the optimizer states of TP-replicated parameters on every TP rank, and it keeps
the padding between parameters in its buckets (formulas.md 12.2 gives their size).

All functions take arrays of candidates (planner.layout.Candidates or a Layout) and return
arrays in bytes or seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import failures, memory, pipeline
from . import model_counts as mc
from .memory import RANK_KINDS, rank_index
from . import blocks
from ..checkpoint_spec import LLAMA3_SOURCE

MEGATRON_SOURCE = ("Megatron-LM @ d98e8a64ddf3 megatron/core/optimizer/distrib_optimizer.py "
                   "_get_main_param_and_optimizer_states; frameworks_checkpoints.md 3.1")


@dataclass(frozen=True)
class CheckpointFormat:
    """Bytes per parameter a checkpoint holds: model weights as saved, the optimizer's master
    copy (0 where the weights are the master, as in fp32 torchtitan), Adam's two moments."""

    name: str
    weight_bytes: float
    master_bytes: float
    moment_bytes: float
    source: str = ""

    @property
    def bytes_per_param(self) -> float:
        return self.weight_bytes + self.master_bytes + self.moment_bytes


# The checkpoint format each framework writes (frameworks_checkpoints.md 3.1)
FORMAT_NAMES = {"megatron-core": "Megatron-Core torch_dist", "torchtitan": "torchtitan DCP",
                "deepspeed": "DeepSpeed ZeRO checkpoint"}


# Megatron-Core's ZeRO-2/3: Megatron-FSDP with --data-parallel-sharding-strategy (the Megatron and
# Bridge exports write these), which saves with --ckpt-format fsdp_dtensor, else torch_dist
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
FSDP_FORMAT = "Megatron-Core fsdp_dtensor (Megatron-FSDP)"


def megatron_ckpt_format(zero_stage: int) -> str:
    """Megatron-Core's --ckpt-format for a layout of ``zero_stage``: fsdp_dtensor under
    Megatron-FSDP (MEGATRON_FSDP_STRATEGY), else torch_dist."""
    return "fsdp_dtensor" if zero_stage in MEGATRON_FSDP_STRATEGY else "torch_dist"


def megatron_format(training: TrainingSpec) -> CheckpointFormat:
    """The state the training's framework writes, per parameter (memory.state_bytes: the same
    bytes the memory model holds): Megatron-Core torch_dist weights in the training dtype (2 B),
    fp32 main params (4 B), Adam exp_avg and exp_avg_sq (4 B each): 14 B; torchtitan's DCP of
    fp32 parameters that are their own master and Adam's moments: 12 B."""
    weights, master, moments = memory.state_bytes(training)
    name = FORMAT_NAMES.get(training.framework, f"{training.framework} checkpoint")
    return CheckpointFormat(name, weights, master, moments, MEGATRON_SOURCE)


@dataclass(frozen=True)
class ParamGroup:
    """Parameters whose checkpoint writes are shared alike (see the module docstring).

    ``params``: parameters of the group one GPU holds; ``spread``: GPUs that share the writes of
    one copy (float, >= 1); ``stride``: a GPU of tensor-parallel rank t writes its copy iff
    t % stride == 0 (1: every GPU; tp: TP rank 0 only). Arrays broadcast over candidates."""

    name: str
    params: np.ndarray
    spread: np.ndarray
    stride: np.ndarray


def param_groups(model: ModelSpec, c, rank) -> list[ParamGroup]:
    """The parameter groups of one GPU of pipeline rank ``rank`` (int array), from
    memory.rank_params and the rank's blocks (blocks.rank_blocks x blocks.block_params):
    tp-sharded (written by every GPU) and tp-replicated (norms, row-parallel biases, routers,
    MLA down-projections, learned positions; TP rank 0), both spread over the dp*cp group
    (LayoutDegrees.grad_group); experts (E*P_e/(ep*etp) per GPU, every GPU writes its share)
    spread over the expert-data-parallel group (edp: Megatron-Core shards expert state there,
    moe.md 3.3). The tied output layer on the last rank (pp > 1) is left out: it is a replica
    of the first rank's embedding."""
    rank = np.asarray(rank)
    p = memory.rank_params(model, c, rank)
    # the schedule places the embedding and the head (pipeline.holds_embedding, holds_head: the
    # V shapes put the head on rank 0)
    is_first, is_last = pipeline.holds_embedding(c, rank), pipeline.holds_head(c, rank)
    counts, per_block = blocks.rank_blocks(model, c, rank), blocks.block_params(model, c)
    norm = float(mc.norm_params(model))
    # the final norm and each MTP module's three norms are TP-replicated on the last rank
    replicated = sum(counts[k] * per_block[k][1] for k in counts) \
        + np.where(is_first, float(mc.position_embedding_params(model)), 0.0) \
        + np.where(is_last, norm + model.mtp_layers * mc.mtp_norm_params(model), 0.0)
    tied_copy = p["output"] if model.tie_embeddings else 0.0
    sharded = memory.non_expert_params(p) - replicated - tied_copy
    spread = np.asarray(c.grad_group, dtype=np.float64)
    groups = [ParamGroup("tp-sharded", sharded, spread, np.ones_like(spread)),
              ParamGroup("tp-replicated", replicated, spread, np.asarray(c.tp, dtype=np.float64))]
    if model.moe is not None:
        edp = np.asarray(c.edp, dtype=np.float64)
        groups.append(ParamGroup("experts", p["experts"], edp, np.ones_like(edp)))
    return groups


def _format(fmt: CheckpointFormat | None, training: TrainingSpec | None) -> CheckpointFormat:
    """``fmt``, else the training's megatron_format; ValueError if neither is given."""
    if fmt is not None:
        return fmt
    if training is None:
        raise ValueError("give the checkpoint format or the training it follows from")
    return megatron_format(training)


def rank_bytes(model: ModelSpec, c, rank, tp_rank=0, fmt: CheckpointFormat | None = None,
               training: TrainingSpec | None = None) -> np.ndarray:
    """Bytes one GPU (pipeline rank ``rank``, tensor-parallel rank ``tp_rank``) writes:
    sum over the groups it writes of bytes_per_param * params / spread. TP rank 0 writes the
    most. ``fmt`` default: megatron_format(training); ValueError if neither is given. ``rank``
    an int, ``tp_rank`` an int or array; bytes, an array of the candidates' shape."""
    beta = _format(fmt, training).bytes_per_param
    t = np.asarray(tp_rank)
    return sum(np.where(t % g.stride == 0, beta * g.params / g.spread, 0.0)
               for g in param_groups(model, c, rank))


def stage_bytes(model: ModelSpec, c, rank, fmt: CheckpointFormat | None = None,
                training: TrainingSpec | None = None) -> np.ndarray:
    """Bytes all tp*cp*dp GPUs of pipeline rank ``rank`` write: each group's unique state,
    bytes_per_param * params * stage_gpus / (spread * stride). ``fmt`` default:
    megatron_format(training); ValueError if neither is given. Bytes, an array."""
    beta = _format(fmt, training).bytes_per_param
    gpus = np.asarray(c.stage_gpus, dtype=np.float64)
    return sum(beta * g.params * gpus / (g.spread * g.stride) for g in param_groups(model, c, rank))


def checkpoint_sizes(model: ModelSpec, training: TrainingSpec, c,
                     fmt: CheckpointFormat | None = None) -> dict[str, np.ndarray]:
    """{total_bytes, largest_rank_bytes, largest_stage}: the whole checkpoint (first + (pp-2) x
    middle + last pipeline rank; uneven splits have equal middle ranks), the bytes of the GPU
    that writes the most (TP rank 0 of the pipeline rank kind with the most) and that pipeline
    rank (0, 1 or pp-1). Float arrays."""
    fmt = fmt or megatron_format(training)
    pp = np.asarray(c.pp)
    ranks = {kind: rank_index(c, kind) for kind in RANK_KINDS}
    stage = {kind: stage_bytes(model, c, r, fmt) for kind, r in ranks.items()}
    total = stage["first"] + np.maximum(pp - 2, 0) * stage["middle"] + np.where(pp > 1, stage["last"], 0.0)
    per_gpu = {kind: rank_bytes(model, c, r, 0, fmt) for kind, r in ranks.items()}
    largest = np.maximum.reduce(list(per_gpu.values()))
    where = np.where(per_gpu["first"] >= largest, 0,
                     np.where(per_gpu["last"] >= largest, pp - 1, 1))
    return {"total_bytes": total, "largest_rank_bytes": largest,
            "largest_stage": where.astype(np.float64)}


# ---------------------------------------------------------------------------- time and failures


def unavailable(hw: HardwareProfile) -> str | None:
    """None when ``hw`` has what checkpoint times need (storage, host_link, host_memory), else
    the missing blocks, e.g. "storage, host_link" (a user's profile may leave them out)."""
    missing = [b for b in ("storage", "host_link", "host_memory") if getattr(hw, b) is None]
    return ", ".join(missing) or None


def save_load_times(hw: HardwareProfile, largest, total, async_save: bool) -> dict[str, np.ndarray]:
    """Seconds of one save and one load (formulas.md 12.3), every GPU writing its share at once.

    stage = largest / host link (device-to-host copy of the GPU that writes the most, the part
    of an asynchronous save that stalls training); write = max(largest / (a host's storage
    write bandwidth / its GPUs), total / the file system's aggregate write bandwidth); load the
    same with read bandwidths (fully parallel load, Megatron ``--ckpt-fully-parallel-load``).
    Asynchronous saves need the staged state in host memory: where largest exceeds host memory
    per GPU the save is synchronous (``async`` False). blocking = stage if async else write;
    save (the whole save) = stage + write if async else write.
    UsageError (from the hardware profile) if a block is missing."""
    largest = np.asarray(largest, dtype=np.float64)
    stage = largest / hw.host_link_bandwidth_per_gpu
    write = np.maximum(largest / hw.storage_write_bandwidth_per_gpu,
                       total / hw.storage.aggregate.write_bandwidth)
    load = np.maximum(largest / hw.storage_read_bandwidth_per_gpu,
                      total / hw.storage.aggregate.read_bandwidth)
    is_async = np.asarray(async_save) & (largest <= hw.host_memory_per_gpu)
    return {"stage_s": stage, "write_s": write, "load_s": load, "async": is_async,
            "blocking_s": np.where(is_async, stage, write),
            "save_s": np.where(is_async, stage + write, write)}


@dataclass(frozen=True)
class CheckpointEstimate:
    """The checkpoint of N candidates: ``values`` (SI arrays of one shape, see
    evaluate_checkpoint) and ``info`` (what is the same for all of them: format, inputs,
    placeholders)."""

    values: dict[str, np.ndarray]
    info: dict

    def take(self, index) -> "CheckpointEstimate":
        return CheckpointEstimate({k: v[index] for k, v in self.values.items()}, self.info)

    def to_dict(self, i: int) -> dict:
        """Candidate i as the ``checkpoint`` object of ``--json`` (SI units); its ``format``
        names Megatron-FSDP's fsdp_dtensor where candidate i shards with it."""
        out = dict(self.info)
        for k, v in self.values.items():
            value = v[i]
            out[k] = bool(value) if k in ("async", "fsdp") else int(value) if k in (
                "interval_steps", "largest_stage") else float(value)
        if out.pop("fsdp"):
            out["format"] = FSDP_FORMAT
        return out


def evaluate_checkpoint(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                        step_s) -> CheckpointEstimate:
    """Checkpoint size, save/load times, the save interval and goodput of candidates ``c``
    whose step takes ``step_s`` seconds (formulas.md 12). Arrays of the shape of ``step_s``:

    total_bytes, largest_rank_bytes, largest_stage (checkpoint_sizes); stage_s, write_s,
    load_s, blocking_s, save_s, async (save_load_times); restart_s = restart_time + load_s; mtbf_s =
    1/(gpus * failures per GPU-s); optimal_interval_s = Daly's tau for delta = blocking_s;
    interval_steps (failures.interval_steps: nearest whole steps, at least the background write
    when async); interval_s = interval_steps * step_s; goodput (failures.goodput at interval_s);
    fsdp (bool: Megatron-Core under Megatron-FSDP, whose format is FSDP_FORMAT).
    UsageError if the profile lacks storage, host_link or host_memory."""
    spec = training.checkpoint
    fmt = megatron_format(training)
    step_s = np.asarray(step_s, dtype=np.float64)
    sizes = checkpoint_sizes(model, training, c, fmt)
    times = save_load_times(hw, sizes["largest_rank_bytes"], sizes["total_bytes"], spec.async_save)
    restart = spec.restart_time + times["load_s"]
    mtbf = failures.job_mtbf(c.gpus, spec.failures_per_gpu_s)
    delta = times["blocking_s"]
    background = np.where(times["async"], times["write_s"], 0.0)
    optimal = failures.daly_interval(delta, mtbf)
    steps = failures.interval_steps(optimal, step_s, background)
    interval = steps * step_s
    values = {**sizes, **times, "restart_s": restart, "mtbf_s": mtbf, "optimal_interval_s": optimal,
              "interval_steps": steps, "interval_s": interval,
              "goodput": failures.goodput(interval, delta, restart, mtbf, background),
              "fsdp": (training.framework == "megatron-core")
              & np.isin(np.asarray(c.zero_stage), list(MEGATRON_FSDP_STRATEGY))}
    shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
    values = {k: np.broadcast_to(v, shape) for k, v in values.items()}
    return CheckpointEstimate(values, _info(hw, training, fmt))


def _info(hw: HardwareProfile, training: TrainingSpec, fmt: CheckpointFormat) -> dict:
    """The inputs shared by every candidate, SI units (the checkpoint object's fixed part)."""
    spec = training.checkpoint
    agg = hw.storage.aggregate
    return {"format": fmt.name, "bytes_per_param": fmt.bytes_per_param,
            "async_save": spec.async_save, "failures_per_gpu_s": spec.failures_per_gpu_s,
            "failure_rate_source": LLAMA3_SOURCE if spec.default_rate else "--failure-rate",
            "restart_time_s": spec.restart_time,
            "host_link_bytes_per_s": hw.host_link_bandwidth_per_gpu,
            "write_bytes_per_s_per_gpu": hw.storage_write_bandwidth_per_gpu,
            "aggregate_write_bytes_per_s": agg.write_bandwidth,
            "aggregate_read_bytes_per_s": agg.read_bandwidth,
            "placeholders": list(hw.storage_placeholders)}


def goodput_of(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c, step_s) -> np.ndarray:
    """Goodput of candidates whose step takes ``step_s`` (evaluate_checkpoint's), for scoring."""
    return evaluate_checkpoint(model, hw, training, c, step_s).values["goodput"]
