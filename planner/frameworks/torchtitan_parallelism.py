"""torchtitan's parallelism section of an exported plan (planner.frameworks.torchtitan): the
degrees, the pipeline (schedule by torchtitan's name, layers per stage, micro-batch size) and
the expert mesh, for the two releases the export targets (RELEASE)."""

from __future__ import annotations

from ..errors import UsageError
from ..plan import Plan
from .common import layers_per_virtual_stage, microbatches

RELEASE = {"overrides": "0.3.0", "toml": "0.2.2"}  # the torchtitan release each format targets


# plan3d's pipeline schedules by torchtitan's names (parallelism.pipeline_parallel_schedule,
# torchtitan/distributed/pipeline_parallel.py at b5bcd76c: PyTorch's schedule classes by name,
# pytorch@00722e648b74 schedules.py get_schedule_class); DualPipe (bidirectional) is not one
SCHEDULE_NAMES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "gpipe": "GPipe",
                  "looped-bfs": "LoopedBFS", "interleaved-zero-bubble": "InterleavedZeroBubble",
                  "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
# What a zero-bubble or V schedule needs beyond its name (reference/pipeline_schedules.md §8,
# §9, §11): split backward, no torch.compile of the stages, torchtitan's own CI of them off
ZERO_BUBBLE_NOTE = (
    "pipeline_parallel_schedule {name}: PyTorch splits each backward into input and weight "
    "gradients (stage_backward_input / stage_backward_weight) and refuses torch.compile'd "
    "stages (schedules.py _check_torch_compile_compatibility); torchtitan's integration tests "
    "of the zero-bubble schedules are disabled at b5bcd76c (FlexAttention BlockMask in the "
    "split backward, tests/integration_tests/features.py L129-164): check it runs with your "
    "attention")
DUALPIPEV_NOTE = (
    "pipeline_parallel_schedule DualPipeV: PyTorch's ScheduleDualPipeV (pytorch PR #159591) "
    "runs each overlapped F&B pair one after the other unless an overlap function is "
    "registered, as the estimate assumed (t_FB = t_F + t_B)")


def parallelism_section(plan: Plan, fmt: str, notes: list[str]) -> tuple[dict[str, object], int]:
    """(the parallelism section, the local batch size): degrees, the pipeline (_pipeline) and
    the expert mesh (expert_parallel)."""
    lay = plan.layout
    par: dict[str, object] = {"tensor_parallel_degree": lay.tp}
    if lay.tp > 1 and not lay.sequence_parallel:
        if fmt == "toml":
            notes.append("the plan has TP without sequence parallelism, but torchtitan 0.2.2 TP "
                         "always shards norms on the sequence (SP): memory will be lower and TP "
                         "traffic different from the estimate")
        else:
            par["enable_sequence_parallel"] = False
    # ZeRO-0 is DDP replicas, ZeRO-3 FSDP (the rules admit these two)
    replicate, shard = (lay.dp, 1) if lay.sharding_stage == 0 else (1, lay.dp)
    par["data_parallel_replicate_degree"] = replicate
    par["data_parallel_shard_degree"] = shard
    par["pipeline_parallel_degree"] = lay.pp
    local = _pipeline(plan, par, notes) if lay.pp > 1 else lay.micro_batch_size
    par["context_parallel_degree"] = lay.cp
    if plan.model.moe is not None:
        par.update(expert_parallel(plan, fmt, shard))
    return par, local


def _schedule_notes(schedule: str, notes: list[str]) -> None:
    """The caveats of a zero-bubble or V schedule (ZERO_BUBBLE_NOTE, DUALPIPEV_NOTE) into
    ``notes``."""
    if schedule in ("interleaved-zero-bubble", "zbv", "dualpipev"):
        notes.append(ZERO_BUBBLE_NOTE.format(name=SCHEDULE_NAMES[schedule]))
    if schedule == "dualpipev":
        notes.append(DUALPIPEV_NOTE)


def _pipeline(plan: Plan, par: dict[str, object], notes: list[str]) -> int:
    """The pipeline fields of a plan with pp > 1 (into ``par``, caveats into ``notes``); returns
    the local batch: all m micro-batches of a DP rank run in one pipeline step. The schedule
    under torchtitan's name (SCHEDULE_NAMES); its stages per rank are the plan's vpp (2 for
    the V shapes, ZBVZeroBubble and DualPipeV, which torchtitan places r and 2p-1-r,
    pipeline_parallel.py L558-567)."""
    lay = plan.layout
    par["pipeline_parallel_schedule"] = SCHEDULE_NAMES[lay.pipeline_schedule]
    _schedule_notes(lay.pipeline_schedule, notes)
    if (lay.first_stage_layers or lay.last_stage_layers) and lay.vpp > 1:
        # torchtitan shortens only the first and the last virtual stage: the embedding-and-
        # loss split (first = last = middle - 1) is that, one layer each (the only
        # interleaved uneven split the rules admit)
        k, less = (plan.model.num_layers + 2) // (lay.pp * lay.vpp), (1, 1)
    elif lay.first_stage_layers or lay.last_stage_layers:  # uneven: middle stages hold k
        f, la, L = lay.first_stage_layers, lay.last_stage_layers, plan.model.num_layers
        k = max(f, la, int(lay.stage_layers(L)[1]))
        less = (k - f, k - la)
    else:
        k, less = layers_per_virtual_stage(plan), (0, 0)
    par["pipeline_parallel_layers_per_stage"] = k
    par["pipeline_parallel_first_stage_less_layers"] = less[0]
    par["pipeline_parallel_last_stage_less_layers"] = less[1]
    par["pipeline_parallel_microbatch_size"] = lay.micro_batch_size
    return microbatches(plan) * lay.micro_batch_size


def expert_parallel(plan: Plan, fmt: str, dp_shard: int) -> dict[str, int]:
    """The expert-parallel fields ({"expert_parallel_degree": ep, ...}), or UsageError naming
    what torchtitan lacks. Both releases fold experts over FSDP x CP x TP: 0.3.0's sparse mesh
    [pp, dp_replicate, efsdp, ep] with efsdp = dp_shard*cp*tp/ep, experts not tensor-parallel
    (etp = 1; configs.py ParallelismConfig has expert_parallel_degree only); 0.2.2's
    [pp, dp_replicate, efsdp, ep, etp] with efsdp = dp_shard*cp*tp/(etp*ep) and etp = 1 or tp
    (distributed/parallel_dims.py L58-59, L135-137; job_config.py Parallelism
    expert_tensor_parallel_degree, default 1, so it is written). DDP replicas
    (data_parallel_replicate_degree) hold no experts."""
    lay = plan.layout
    if fmt == "toml" and lay.etp not in (1, lay.tp):
        raise UsageError(f"torchtitan 0.2.2 shards experts over etp = 1 or tp = {lay.tp} "
                         f"(parallel_dims.py L58-59); this plan has etp={lay.etp}")
    if fmt != "toml" and lay.etp != 1:
        raise UsageError(f"torchtitan 0.3.0 has no expert tensor parallelism (ParallelismConfig "
                         f"has expert_parallel_degree only; experts are not TP-sharded); this "
                         f"plan has etp={lay.etp}")
    ranks = dp_shard * lay.cp * lay.tp
    if ranks % (lay.ep * lay.etp):
        raise UsageError(f"torchtitan {RELEASE[fmt]} takes expert-parallel ranks from FSDP x CP x "
                         f"TP = {ranks} (data_parallel_shard_degree {dp_shard}); ep={lay.ep} x "
                         f"etp={lay.etp} does not divide it (DDP replicas hold no experts)")
    out = {"expert_parallel_degree": lay.ep}
    if fmt == "toml":
        out["expert_tensor_parallel_degree"] = lay.etp
    return out
