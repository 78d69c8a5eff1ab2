"""Megatron-LM ``pretrain_gpt.py`` arguments for a plan, as a shell-ready argument list.

Flag names are those of Megatron-LM's argument parser (megatron/training/arguments.py) at
NVIDIA/Megatron-LM commit d98e8a64ddf3 (2026-08-22); the tests check every emitted flag against
that parser's full option list (tests/data/megatron_options.txt).

Mapping (plan field -> flag):
  tp, pp                 --tensor-model-parallel-size, --pipeline-model-parallel-size
  vpp > 1                --num-layers-per-virtual-pipeline-stage L/(pp*vpp)
  cp                     --context-parallel-size cp
  uneven pipeline split  --decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers;
                         interleaved and not of those forms, --pipeline-model-parallel-layout
                         (layout.split.pipeline_layout)
                         (with vpp > 1: --num-virtual-stages-per-pipeline-rank vpp; a split with
                         first = last = middle - 1 as --account-for-embedding-in-pipeline-split
                         --account-for-loss-in-pipeline-split, LayoutDegrees.embedding_loss_split)
  sequence_parallel      --sequence-parallel
  ZeRO 0                 (plain DDP: no flag)
  ZeRO 1, distopt        --use-distributed-optimizer
  ZeRO 2 / 3             --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads /
                         optim_grads_params --use-distributed-optimizer
                         --no-gradient-accumulation-fusion (Megatron-FSDP v1 as Megatron-LM's
                         examples start it, fsdp_args; plain pretrain_gpt DDP has no ZeRO-2/3)
  environment            a comment: CUDA_DEVICE_MAX_CONNECTIONS unset for Megatron-FSDP, 1 for
                         TP/CP (and TE userbuffers) before Blackwell, 32 for EP overlap, and
                         any conflict (connections, arguments.py L1166-1167, L1453-1479)
  software switches      TP communication overlap, EP overlap, CUDA graphs, token dropping,
                         the MoE dispatcher: megatron_software (flags: megatron_model)
  recompute full         --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  recompute full, N      --recompute-granularity full --recompute-method block --recompute-num-layers N
                         (layout recompute_num_layers N: the first N layers of each model chunk)
  recompute selective    --recompute-granularity selective (Megatron's default module: core_attn)
  recompute selective+   --recompute-granularity selective --recompute-modules layernorm
                         (+ moe_act with experts, mla_up_proj with MLA; common.recompute_modules)
  batch                  --micro-batch-size b --global-batch-size B --seq-length s
  model shape            --num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads,
                         --group-query-attention --num-query-groups g (GQA/MQA), --kv-channels
                         (head_dim != h/a), --swiglu, --normalization, --disable-bias-linear,
                         --position-embedding-type, --rotary-percent (rotary_percent < 1),
                         --rotary-base (rope_theta; integers only,
                         argparse type=int), --max-position-embeddings,
                         --untie-embeddings-and-output-weights, --attention-dropout, --hidden-dropout
  interleaved, m % pp > 0 --microbatch-group-size-per-virtual-pipeline-stage G (microbatch_group)
  training               --bf16 / --fp16, --grad-reduce-in-bf16 (grad_bytes 2),
                         --overlap-grad-reduce (+ --overlap-param-gather with a sharded optimizer),
                         --attention-backend unfused (plan without flash attention)
  precision              --fp8-format hybrid|e4m3 --fp8-recipe tensorwise|blockwise|mxfp8,
                         --fp8-param-gather (per-tensor and MXFP8 with a sharded optimizer),
                         --reuse-grad-buf-for-mxfp8-param-ag (MXFP8)
  checkpoints            --save-interval n (common.save_interval: the Young/Daly optimum in
                         whole steps, formulas.md 12), --ckpt-format torch_dist (fsdp_dtensor
                         with Megatron-FSDP), --async-save --use-persistent-ckpt-worker when
                         saves are asynchronous (without the worker Megatron silently turns
                         async off: arguments.py), --ckpt-fully-parallel-load (torch_dist: each
                         rank reads its share, as the load time assumed)
MoE, expert parallelism (ep, etp), MLA, MTP, sliding windows, QK norms, sinks, Q/K/V biases and
the norm epsilon: planner.frameworks.megatron_model.
What Megatron-Core cannot build or run (ALiBi, a non-integer RoPE base, ...) is refused by the
megatron-core framework profile's rules (planner.search.framework_rules), the ones its search
applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.model_counts import has_dense_mlp
from ..cost.model_flops import padded_vocab
from ..cost import precision
from ..cost.pipeline import microbatch_group
from ..layout.split import pipeline_layout, uneven_interleave_ok
from ..plan import Plan
from .common import (RANK_ORDER_NOTE, Export, comment_lines, describe, interval_note,
                     layers_per_virtual_stage, microbatches, recompute_modules, save_interval,
                     theta_text)
from .megatron_model import CROSS_ENTROPY_NOTE, model_args
from ..cost.checkpoint import MEGATRON_FSDP_STRATEGY, megatron_ckpt_format
from ..search.framework_rules import check_plan
from ..cost.precision import blackwell
from .megatron_software import ep_overlap

SOURCE = "NVIDIA/Megatron-LM commit d98e8a64ddf3 (2026-08-22), megatron/training/arguments.py"
POSITION = {"rope": "rope", "learned": "learned_absolute"}


def megatron_args(plan: Plan) -> list[tuple[str, str | None]]:
    """The (flag, value or None) pairs for ``plan``, in a stable order. UsageError if inexpressible."""
    model, lay, tr = plan.model, plan.layout, plan.training
    m = microbatches(plan)  # validates B % (dp*b)
    check_plan("megatron", plan)  # what Megatron-Core cannot build or run (ALiBi, ...)
    args: list[tuple[str, str | None]] = [
        ("--tensor-model-parallel-size", str(lay.tp)),
        ("--pipeline-model-parallel-size", str(lay.pp)),
    ]
    split = pipeline_split(plan, int(m))
    if split.form == "layout":  # the layout string gives the chunks (arguments.py L927-951)
        args.append(("--pipeline-model-parallel-layout", f"'{split.layout}'"))  # "|", "*": quoted
    elif split.form != "even" and lay.vpp > 1:  # chunks per rank; layers per chunk follow the split
        args.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
    elif lay.vpp > 1:
        args.append(("--num-layers-per-virtual-pipeline-stage", str(layers_per_virtual_stage(plan))))
    if split.microbatch_group:
        args.append(("--microbatch-group-size-per-virtual-pipeline-stage", str(split.microbatch_group)))
    if split.form == "embedding_loss":
        args += [("--account-for-embedding-in-pipeline-split", None),
                 ("--account-for-loss-in-pipeline-split", None)]
    elif split.form == "first_last":
        args += [("--decoder-first-pipeline-num-layers", str(lay.first_stage_layers)),
                 ("--decoder-last-pipeline-num-layers", str(lay.last_stage_layers))]
    args.append(("--context-parallel-size", str(lay.cp)))
    if lay.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if lay.sharding_stage == 1:
        args.append(("--use-distributed-optimizer", None))
    elif lay.zero_stage in MEGATRON_FSDP_STRATEGY:
        args += fsdp_args(lay.zero_stage)
    args += recompute_args(plan)
    args += [
        ("--micro-batch-size", str(lay.micro_batch_size)),
        ("--global-batch-size", str(tr.global_batch_size)),
        ("--seq-length", str(tr.seq_length)),
        ("--max-position-embeddings", str(max(model.max_position_embeddings or 0, tr.seq_length))),
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(model.hidden_size)),
    ] + [("--ffn-hidden-size", str(model.ffn))] * has_dense_mlp(model) + [
        ("--num-attention-heads", str(model.num_attention_heads)),
    ]
    args += shape_args(model)
    args += [("--attention-dropout", f"{model.dropout:g}"), ("--hidden-dropout", f"{model.dropout:g}")]
    args.append(("--bf16", None) if tr.dtype == "bf16" else ("--fp16", None))
    if tr.grad_bytes == 2:
        args.append(("--grad-reduce-in-bf16", None))
    if tr.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce", None))
        if lay.sharding_stage >= 1:
            args.append(("--overlap-param-gather", None))
    if not tr.flash_attention:
        args.append(("--attention-backend", "unfused"))
    return args + fp8_args(plan) + model_args(plan)[0] + checkpoint_args(plan, save_interval(plan))


def shape_args(model) -> list[tuple[str, str | None]]:
    """The model-shape flags after the widths: GQA groups, --kv-channels where the head
    width is not h/a, activation, norm, biases, positions (RoPE base and rotary share),
    untied embeddings."""
    args: list[tuple[str, str | None]] = []
    if model.kv_heads != model.num_attention_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", str(model.kv_heads))]
    if model.kv_channels != model.hidden_size // model.num_attention_heads or \
            model.hidden_size % model.num_attention_heads:
        args.append(("--kv-channels", str(model.kv_channels)))
    if model.activation == "swiglu":
        args.append(("--swiglu", None))
    args.append(("--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"))
    if not model.bias:
        args.append(("--disable-bias-linear", None))
    args.append(("--position-embedding-type", POSITION[model.position_embedding]))
    if model.position_embedding == "rope" and model.rope_theta is not None:
        args.append(("--rotary-base", theta_text(model.rope_theta)))  # an integer (rules)
    if model.position_embedding == "rope" and model.rotary_percent < 1.0:
        args.append(("--rotary-percent", f"{model.rotary_percent:g}"))
    if not model.tie_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    return args


def fsdp_args(zero_stage: int) -> list[tuple[str, str | None]]:
    """Megatron-FSDP for ZeRO-2/3 as Megatron-LM's Megatron-FSDP examples start it
    (NVIDIA/Megatron-LM @d98e8a64ddf3 examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh
    L113-121, sbatch_mfsdp_deepseek_v3.sh L139-148; docs/user-guide/features/megatron_fsdp.md):
    --use-megatron-fsdp, the sharding strategy, --use-distributed-optimizer (Megatron-FSDP v1,
    the default --megatron-fsdp-version, turns it on with a warning when it is missing:
    arguments.py L1127-1135) and --no-gradient-accumulation-fusion (arguments.py L1153-1160
    only warns that fused gradient accumulation may not be supported with Megatron-FSDP).
    The checkpoint format it asserts (fsdp_dtensor, L1169-1170) is checkpoint_args'."""
    return [("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[zero_stage]),
            ("--use-distributed-optimizer", None), ("--no-gradient-accumulation-fusion", None)]


@dataclass(frozen=True)
class Connections:
    """CUDA_DEVICE_MAX_CONNECTIONS for a Megatron-Core plan (connections): ``value`` what to
    set ("1" or "32"; None: nothing is required), ``shell`` the line a launch script runs
    (``export ...`` / ``unset ...``; "" when nothing is required), ``why`` the comments: the
    source of the requirement and any conflict between what TP/CP and FSDP or EP overlap want."""

    value: str | None
    shell: str
    why: list[str]


# What Transformer Engine's userbuffers (--tp-comm-overlap) want of CUDA_DEVICE_MAX_CONNECTIONS
# (NVIDIA/TransformerEngine v2.14 examples/pytorch/comm_gemm_overlap/README.md L3-11: 1)
UB_CONNECTIONS = ("; Transformer Engine's userbuffers for --tp-comm-overlap want 1 too: "
                  "TransformerEngine v2.14 examples/pytorch/comm_gemm_overlap/README.md L3-11")


def connections(plan: Plan) -> Connections:
    """What Megatron-LM's validate_args (NVIDIA/Megatron-LM @d98e8a64ddf3
    megatron/training/arguments.py) requires of CUDA_DEVICE_MAX_CONNECTIONS for ``plan``:
    Megatron-FSDP asserts it is not 1 (L1166-1167); TP or CP before Blackwell asserts 1
    (L1477-1479) unless beside FSDP or EP overlap, where it only warns that they want
    different values (L1453-1475); EP overlap wants more than 1 (megatron/core/transformer/
    moe/README.md L437); Transformer Engine's userbuffers (TP communication overlap) want 1
    before Blackwell (UB_CONNECTIONS; beside the EP overlap the software rules refuse them).
    Blackwell: cost.precision.blackwell (the profile has an MXFP8 peak)."""
    lay = plan.layout
    fsdp, overlap = lay.zero_stage in MEGATRON_FSDP_STRATEGY, ep_overlap(plan)
    tp_cp = (lay.tp > 1 or lay.cp > 1) and not blackwell(plan.hardware)
    what = f"tp={lay.tp} cp={lay.cp} on {plan.hardware.gpu.name}"
    unset = "unset CUDA_DEVICE_MAX_CONNECTIONS"
    ub = UB_CONNECTIONS if lay.tp_comm_overlap and tp_cp else ""
    if fsdp:
        why = ["Megatron-FSDP asserts it is not 1 (arguments.py L1166-1167)"]
        if tp_cp:
            why.append(f"environment conflict: {what} wants 1 (Megatron-LM asserts it for "
                       "TP/CP before Blackwell, and only warns beside FSDP: arguments.py "
                       f"L1453-1465{ub}); "
                       "unset, the TP backward communication is not queued ahead of the "
                       "weight-gradient GEMM, so the TP overlap the estimate assumed may fall "
                       "short")
        return Connections("32", unset, why)
    if overlap:
        why = ["EP overlap needs it above 1 (megatron/core/transformer/moe/README.md L437)"]
        if tp_cp:
            why.append(f"environment conflict: {what} wants 1, EP overlap more than 1; "
                       "Megatron-LM only warns (arguments.py L1466-1475: 1 or 32 by which "
                       "overlap matters "
                       "more); 32 keeps the EP overlap the estimate assumed, and the TP "
                       "overlap may fall short")
        return Connections("32", "export CUDA_DEVICE_MAX_CONNECTIONS=32", why)
    if tp_cp:
        return Connections("1", "export CUDA_DEVICE_MAX_CONNECTIONS=1",
                           [f"Megatron-LM asserts it for {what} (TP or CP before Blackwell: "
                            f"arguments.py L1477-1479{ub})"])
    return Connections(None, "", [])


def environment_comments(plan: Plan) -> list[str]:
    """The export's environment comments (connections): what to run before the launch and why;
    one comment saying nothing is required where nothing is."""
    env = connections(plan)
    if not env.shell:
        return ["environment: CUDA_DEVICE_MAX_CONNECTIONS is not required here (no TP/CP before "
                "Blackwell, no Megatron-FSDP, no EP overlap: arguments.py L1453-1479)"]
    return [f"environment: {env.shell} before launching: {env.why[0]}"] + env.why[1:]


def recompute_args(plan: Plan) -> list[tuple[str, str | None]]:
    """Activation offload and recomputation flags of ``plan``'s layout: full recompute of every
    layer (uniform, 1 layer per group) or of the first N of each model chunk (block method),
    selective (core attention) or selective with modules (selective+)."""
    lay = plan.layout
    args: list[tuple[str, str | None]] = []
    if lay.offload_layers:  # Megatron-Core: sets cpu_offloading (arguments.py L1950-1951)
        args.append(("--cpu-offloading-num-layers", str(lay.offload_layers)))
    if lay.recompute == "full" and lay.recompute_num_layers:  # the first N of each model chunk
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", str(lay.recompute_num_layers))]
    elif lay.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", "1")]
    elif lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    elif lay.recompute == "selective+":
        args += [("--recompute-granularity", "selective"),
                 ("--recompute-modules", " ".join(recompute_modules(plan.model)))]
    return args


# plan3d precision -> Megatron-LM --fp8-format and --fp8-recipe, as Megatron-Bridge's presets set
# them (training/mixed_precision.py @05097809: current scaling hybrid/tensorwise, subchannel
# hybrid/blockwise, MXFP8 e4m3/mxfp8)
FP8_ARGS = {"fp8": ("hybrid", "tensorwise"), "fp8-blockwise": ("hybrid", "blockwise"),
            "mxfp8": ("e4m3", "mxfp8")}


def fp8_args(plan: Plan) -> list[tuple[str, str | None]]:
    """--fp8-format, --fp8-recipe and, where the recipe gathers FP8 parameters and the optimizer
    is sharded (Megatron requires the distributed optimizer or FSDP for it), --fp8-param-gather
    (+ --reuse-grad-buf-for-mxfp8-param-ag for MXFP8, as Bridge asserts); none in BF16."""
    tr, lay = plan.training, plan.layout
    if tr.precision not in FP8_ARGS:
        return []
    fmt, recipe = FP8_ARGS[tr.precision]
    args = [("--fp8-format", fmt), ("--fp8-recipe", recipe)]
    if precision.fp8_param_gather(tr) and lay.sharding_stage >= 1:
        args.append(("--fp8-param-gather", None))
        if tr.precision == "mxfp8" and lay.zero_stage not in MEGATRON_FSDP_STRATEGY:
            # Megatron-FSDP turns it off (arguments.py L1136-1137)
            args.append(("--reuse-grad-buf-for-mxfp8-param-ag", None))
    return args


def checkpoint_args(plan: Plan, ck: dict | None) -> list[tuple[str, str | None]]:
    """--save-interval and the checkpoint format/mode flags for the plan's checkpoint estimate
    ``ck`` (common.save_interval); none without one."""
    if ck is None:
        return []
    fsdp = plan.layout.zero_stage in MEGATRON_FSDP_STRATEGY
    args = [("--save-interval", str(ck["interval_steps"])),
            ("--ckpt-format", megatron_ckpt_format(plan.layout.zero_stage))]
    if ck["async"]:
        args += [("--async-save", None), ("--use-persistent-ckpt-worker", None)]
    if not fsdp:
        args.append(("--ckpt-fully-parallel-load", None))
    return args


@dataclass(frozen=True)
class PipelineSplit:
    """How Megatron-Core is told the plan's pipeline split (the same TransformerConfig fields
    under Megatron-LM's flags and Megatron-Bridge's model fields). ``form``: "even";
    "embedding_loss" (an interleaved uneven split of the first = last = middle - 1 form,
    account_for_embedding/loss_in_pipeline_split; only with vpp > 1, where the layer counts per
    chunk cannot be given); "first_last" (an uneven split whose stages each divide by vpp, or
    not interleaved: the first and last stages' layer counts); "layout" (any other interleaved
    uneven split: ``layout``, the --pipeline-model-parallel-layout string of
    layout.split.pipeline_layout, which sets the chunks itself and excludes the other split
    and vpp arguments: arguments.py L927-951, transformer_config.py L2242-2290 @d98e8a64).
    ``microbatch_group``: the interleaved schedule's group when pp does not divide the
    micro-batches (0 when not needed)."""

    form: str
    microbatch_group: int
    layout: str = ""


def pipeline_split(plan: Plan, m: int) -> PipelineSplit:
    """The plan's PipelineSplit for m micro-batches per step."""
    lay = plan.layout
    if not bool(lay.uneven()):
        form = "even"
    elif lay.vpp > 1 and bool(lay.embedding_loss_split(plan.model.num_layers)):
        form = "embedding_loss"
    elif lay.vpp > 1 and not bool(uneven_interleave_ok(plan.model.num_layers, lay)):
        form = "layout"
    else:
        form = "first_last"
    text = pipeline_layout(plan.model.num_layers, lay.pp, lay.vpp, lay.first_stage_layers,
                           lay.last_stage_layers, plan.model.mtp_layers) if form == "layout" else ""
    return PipelineSplit(form, microbatch_group(m, lay.pp) if lay.vpp > 1 and m % lay.pp else 0, text)


def fsdp_comment(plan: Plan, ck: dict | None) -> str:
    """The comment of a ZeRO-2/3 plan: Megatron-FSDP, its flags and checkpoint format (fsdp_args,
    checkpoint_args); ``ck`` the plan's checkpoint estimate (common.save_interval)."""
    return (f"ZeRO-{plan.layout.zero_stage} is Megatron-FSDP v1 here (plain DDP and the "
            "distributed optimizer shard only optimizer states), started as Megatron-LM's "
            "examples/megatron_fsdp scripts start it: --use-distributed-optimizer (v1 needs "
            "it), --no-gradient-accumulation-fusion; check that your Megatron-LM version runs "
            "Megatron-FSDP with this tp/pp; its checkpoints are --ckpt-format fsdp_dtensor"
            + (", whose --async-save needs nvidia-resiliency-ext (async strategy nvrx)"
               if ck is not None and ck["async"] else ""))


def export_megatron(plan: Plan) -> Export:
    """Megatron-LM arguments: header comments, then one flag per line joined by `` \\``."""
    args = megatron_args(plan)
    model, lay = plan.model, plan.layout
    ck = save_interval(plan)
    vp = int(padded_vocab(model.vocab_size, lay.tp))
    comments = [
        f"Megatron-LM pretrain_gpt.py arguments for {describe(plan)}",
        f"flag names: {SOURCE}",
        RANK_ORDER_NOTE,
        f"vocabulary (vocab_size {model.vocab_size}): from your tokenizer (--tokenizer-type ...; --vocab-size with "
        f"NullTokenizer); Megatron pads it to a multiple of 128*tp = {128 * lay.tp}: {vp}",
        "not set here: data, tokenizer, optimizer and LR schedule, --train-iters/--train-samples, "
        "--save/--load directories, logging",
        interval_note(ck, plan),
    ]
    comments += environment_comments(plan)
    if lay.zero_stage in MEGATRON_FSDP_STRATEGY:
        comments.append(fsdp_comment(plan, ck))
    if lay.recompute == "selective" and plan.training.selective_recompute == "per_op":
        comments.append("selective recomputation = Megatron's default --recompute-modules core_attn; "
                        "the plan assumed per-op selective checkpointing (torchtitan's), which "
                        "saves a different set of tensors")
    elif lay.recompute == "selective":
        comments.append("selective recomputation = Megatron's default --recompute-modules core_attn, "
                        "as the cost model assumed")
    if model.position_embedding == "rope" and model.rope_theta is None:
        comments.append(f"RoPE base: not set for {model.name} (rope_theta unknown), so Megatron-LM's "
                        "default --rotary-base 10000 applies; check it against the model you mean "
                        "to train")
    comments += model_args(plan)[1]
    if not plan.training.flash_attention:
        comments.append("the plan assumed attention without flash attention (scores stored): "
                        "--attention-backend unfused")
    m = microbatches(plan)
    if lay.vpp > 1 and m % lay.pp:
        comments.append(f"{m} micro-batches are not a multiple of pp = {lay.pp}: the interleaved "
                        f"schedule runs them in groups of {microbatch_group(m, lay.pp)} (the "
                        f"estimate holds that many more forwards in flight)")
    lines = [flag if value is None else f"{flag} {value}" for flag, value in args]
    text = comment_lines(comments) + " \\\n".join(lines) + "\n"
    notes = [CROSS_ENTROPY_NOTE] if plan.training.cross_entropy_in_place else []
    return Export("megatron", text, notes=notes, keys=[flag for flag, _ in args])
