"""Candidate layouts as one struct of numpy arrays, and the constraints that prune them.

Every field is an int64 (or bool) array of the same length N; the cost model evaluates all N at
once. Nothing here loops over candidates in Python: the space is a Cartesian product built with
numpy, then filtered by boolean masks, each rule named so the search can say what it pruned.
"""

from __future__ import annotations


import numpy as np

from ..cost.pipeline import schedule_chunks_ok
from ..cost.pipeline import schedule_microbatches_ok as schedule_mb_ok
from ..layout import Candidates
from ..layout.split import uneven_shape_ok
from ..cost.collectives import nvlink_domain
from ..specs import HardwareProfile, ModelSpec, TrainingSpec


from ..framework_spec import FrameworkProfile
from .framework_rules import framework_masks, profile_for
from .software_rules import software_masks

# Every TP implementation splits whole attention heads over the tp ranks; what it does with the
# KV heads (query groups) is the framework's rule (search.framework_rules, kv_heads_tp).
HEADS_RULE = "attention heads divisible by tp"
TP_RULE = "tp within the NVLink domain"
# framework-neutral: the shape plan3d models; how a framework interleaves an uneven split is its
# own rule (framework_rules: Megatron-Core's two forms, torchtitan's embedding-and-loss form)
UNEVEN_RULE = "uneven pipeline split: edge stages of 1..middle layers, equal middle stages"
LAYERS_RULE = "layers divisible by pp*vpp"
BATCH_RULE = "global batch divisible by dp*micro_batch_size"


def constraint_masks(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile,
                     c: Candidates, allow_cross_node_tp: bool = False,
                     framework: "FrameworkProfile | None" = None) -> dict[str, np.ndarray]:
    """Named validity rules -> boolean arrays (True = the candidate passes that rule). Masks broadcast.

    The rules of every layout plan3d models: tp within the NVLink domain (GPUs on one NVLink
    fabric, hardware ``hw``'s nvlink_domain) unless ``allow_cross_node_tp``; attention heads divisible by tp;
    the FFN width divisible by tp (its column/row-parallel linear layers divide their
    output/input size); layers divisible by pp*vpp (or an uneven split); the global batch
    divisible by dp*micro_batch_size; SP needs tp > 1 and each CP rank's share of the sequence,
    seq_length/cp, divisible by tp; CP needs seq_length divisible by 2*cp (its causal load
    balance cuts every sequence into 2*cp chunks) and flash attention; the distributed optimizer
    goes with zero_stage 0; an uneven split of the shape plan3d models (its interleaved forms are
    the framework's rule); recompute_num_layers
    only with full recompute and at most a chunk's layers. Then the rules of the
    training framework (``framework``, default: the profile named by ``training.framework``;
    framework_rules.framework_masks): KV heads against tp, interleaving and micro-batches,
    uneven split forms, ZeRO stages, recomputation, ...; and of its software switches on
    ``hw`` (software_rules.software_masks).
    """
    a, L = model.num_attention_heads, model.num_layers
    B, s = training.global_batch_size, training.seq_length
    tp, pp, vpp, cp = c.tp, c.pp, c.vpp, c.cp
    masks = {
        TP_RULE: (tp <= nvlink_domain(hw)) | allow_cross_node_tp,
        HEADS_RULE: a % tp == 0,
        "ffn_hidden_size divisible by tp": model.ffn % tp == 0,
        LAYERS_RULE: (L % (pp * vpp) == 0) | (c.first_stage_layers > 0),
        BATCH_RULE: (B % (c.dp * c.micro_batch_size) == 0),
        "seq_length divisible by 2*cp": (cp == 1) | (s % (2 * cp) == 0),
        "sequence parallel needs tp > 1 and seq_length/cp divisible by tp":
            ~c.sequence_parallel | ((tp > 1) & (s % (cp * tp) == 0)),
        "context parallel needs flash attention": (cp == 1) | training.flash_attention,
        "distributed optimizer replaces ZeRO (zero_stage 0 only)":
            ~c.distributed_optimizer | (c.zero_stage == 0),
        UNEVEN_RULE: uneven_shape_ok(L, c),
        SCHEDULE_RULE: schedule_ok(c),
        SCHEDULE_MB_RULE: schedule_microbatches_ok(c, c.num_microbatches(B)),
        RECOMPUTE_LAYERS_RULE: _recompute_layers_ok(L, c),
        **expert_rules(model, c),
    }
    profile = profile_for(training, framework)
    masks.update(framework_masks(profile, model, training, c))
    masks.update(software_masks(profile, model, training, c, hw))
    return masks


SCHEDULE_RULE = ("pipeline schedule: its chunks per rank (vpp 1: 1F1B, GPipe, DualPipe; vpp 2: "
                 "ZB-V, DualPipeV; vpp > 1: interleaved 1F1B and zero bubble, looped BFS) and pp > 1 "
                 "beyond 1F1B")
SCHEDULE_MB_RULE = ("pipeline schedule: the micro-batches its generator takes (DualPipe p, m even "
                    "and m >= 2p; DualPipeV m >= 2p; interleaved zero bubble PyTorch's rounds)")


def schedule_ok(c) -> np.ndarray:
    """The pipeline schedule against the model chunks per rank and pp (cost.pipeline.
    schedule_chunks_ok: the generators' own constraints). Bool array."""
    return schedule_chunks_ok(c.pipeline_schedule, c.vpp, c.pp)


def schedule_microbatches_ok(c, m) -> np.ndarray:
    """The micro-batches per step ``m`` the schedule's generator takes (cost.pipeline.
    schedule_microbatches_ok). Bool array."""
    return schedule_mb_ok(c.pipeline_schedule, c.pp, m)


RECOMPUTE_LAYERS_RULE = "recompute_num_layers only with full recompute, at most a model chunk's layers"


def _recompute_layers_ok(num_layers: int, c) -> np.ndarray:
    """recompute_num_layers N = 0, or N >= 1 with full recompute (code 2) and N at most the
    layers of the largest model chunk (Megatron-Core: "recompute_num_layers must be between 1
    and num_layers_per_pipeline_rank", transformer_config.py __post_init__). Bool array."""
    n = np.asarray(c.recompute_num_layers)
    if not np.any(n > 0):
        return np.ones(np.shape(n), dtype=bool)
    largest = np.maximum.reduce([c.rank_chunk_layers(num_layers, r)[0]
                                 for r in (0, np.minimum(1, c.pp - 1), c.pp - 1)])
    return (n == 0) | ((np.asarray(c.recompute) == 2) & (n <= largest))


def rules_broken(masks: dict[str, np.ndarray]) -> list[str]:
    """The rules of ``masks`` (rule -> bool array, e.g. constraint_masks or expert_rules on one
    layout's Candidates) that some candidate fails, in their order: what one layout breaks."""
    return [rule for rule, ok in masks.items() if not np.all(ok)]


EXPERT_RULE = "experts divisible by ep"
FOLDING_RULE = "etp*ep dividing the tp*cp*dp GPUs of a pipeline stage"


def folds(stage_gpus, etp, ep) -> np.ndarray:
    """FOLDING_RULE (Megatron-Core parallel folding, moe.md 3.2): the expert groups of etp*ep
    GPUs tile the tp*cp*dp GPUs of a pipeline stage (edp = tp*cp*dp/(etp*ep)). Broadcast bool
    array; an etp or ep of 0 (no such mesh) folds nothing."""
    group = np.asarray(etp) * np.asarray(ep)
    return (group > 0) & (np.asarray(stage_gpus) % np.maximum(group, 1) == 0)


MOE_SP_RULE = "MoE with tp > 1 needs sequence parallelism"


def moe_needs_sp(model: ModelSpec, tp) -> bool:
    """Whether the expert mesh rule MOE_SP_RULE asks for sequence parallelism: an MoE model at
    tp > 1 (Megatron-Core's MoELayer raises without it in training). The default a stated
    layout takes where SP is not given (estimate, runs files)."""
    return model.moe is not None and int(tp) > 1


def expert_rules(model: ModelSpec, c) -> dict[str, np.ndarray]:
    """Named rules of the expert mesh (Megatron-Core, moe.md 3.2): a dense model has ep = etp = 1;
    an MoE model needs num_experts divisible by ep and etp*ep dividing the stage's tp*cp*dp GPUs
    (parallel folding: edp = tp*cp*dp/(etp*ep)), the expert FFN width divisible by etp, sequence
    parallelism when tp > 1 (MoELayer raises without it in training), and etp = 1 with biased
    experts (add_bias_linear with MoE, transformer_config.py L2612-2615)."""
    ep, etp = np.asarray(c.ep), np.asarray(c.etp)
    if model.moe is None:
        return {"expert parallelism needs an MoE model (ep = etp = 1)": (ep == 1) & (etp == 1)}
    m = model.moe
    rules = {EXPERT_RULE: m.num_experts % ep == 0, FOLDING_RULE: folds(c.stage_gpus, etp, ep),
             "expert ffn_hidden_size divisible by etp": m.ffn_hidden_size % etp == 0,
             MOE_SP_RULE: (np.asarray(c.tp) == 1) | c.sequence_parallel}
    if model.bias:
        rules["MoE with biases needs etp = 1"] = etp == 1
    return rules
