"""What every framework export shares: the Export result and the numbers derived from a plan.

A plan (planner.specs.Plan) fixes tp, pp, dp, ZeRO stage, micro-batch size b, recomputation,
sequence parallelism and vpp for a model, a global batch B and a sequence length s. Each target
spells these differently; the derived quantities below are the same for all of them:

  m  = B / (dp * b)            micro-batches per optimizer step (per pipeline, per DP rank)
  lv = L / (pp * vpp)          transformer layers per virtual pipeline stage (model chunk)

Nothing here is target-specific. What a target cannot express is reported either as an
UsageError (the result would describe a different model or schedule) or as a note, which the
exporter writes as a comment into the output (or, for JSON, on stderr): never dropped silently.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from ..errors import UsageError
from ..plan import Plan
from .. import fmt
from ..cost.checkpoint import evaluate_checkpoint, unavailable
from ..cost.step import estimate_layout
from ..framework_spec import SELECTIVE_PLUS_MODULES


@dataclass
class Export:
    """An exported configuration.

    ``text`` is the file content (comments included where the format has comments); ``notes`` are
    the caveats that could not go into ``text`` (JSON has no comments) and must be shown to the
    user separately; ``keys`` are the option/field names ``text`` sets, for checking against a
    target's real option list.
    """

    target: str
    text: str
    notes: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


def microbatches(plan: Plan) -> int:
    """m = B / (dp * b): micro-batches per step; UsageError if the plan's batch does not divide."""
    lay, B = plan.layout, plan.training.global_batch_size
    if B % (lay.dp * lay.micro_batch_size):
        raise UsageError(f"global batch {B} is not divisible by dp*micro_batch_size = "
                         f"{lay.dp * lay.micro_batch_size}; the plan is inconsistent")
    return int(lay.num_microbatches(B))


def layers_per_virtual_stage(plan: Plan) -> int:
    """L / (pp * vpp): layers in each model chunk (Megatron ``--num-layers-per-virtual-pipeline-stage``)."""
    lay, L = plan.layout, plan.model.num_layers
    if L % (lay.pp * lay.vpp):
        raise UsageError(f"num_layers {L} is not divisible by pp*vpp = {lay.pp * lay.vpp}; "
                         "the plan is inconsistent")
    return L // (lay.pp * lay.vpp)


def describe(plan: Plan) -> str:
    """One line naming the plan: model, GPUs, layout (for the header comment of every export)."""
    return (f"{plan.model.name} on {plan.gpus} x {plan.hardware.gpu.name} ({plan.hardware.name}), "
            f"{plan.layout.short()}, global batch {plan.training.global_batch_size} x "
            f"{plan.training.seq_length} tokens")


# The width of every line an export writes (comments wrapped at spaces; a single word longer
# than a line, such as a long flag value, stands alone on its line)
COLUMNS = 80


def comment_lines(comments, prefix: str = "# ", width: int = COLUMNS) -> str:
    """``comments`` as comment lines of at most ``width`` columns, for formats whose comments
    start with ``#`` to the end of the line (shell, YAML, TOML): each comment wrapped at spaces,
    its continuation lines indented two more spaces; words are never split, nor names at their
    hyphens (--flag-names), so a word longer than a line stands alone on a longer one. A
    comment's own leading spaces are kept. Returns the text with a newline after each line."""
    out: list[str] = []
    for comment in comments:
        lead = prefix + " " * (len(comment) - len(comment.lstrip(" ")))
        out += textwrap.wrap(comment.strip(), width=width, initial_indent=lead,
                             subsequent_indent=lead + "  ", break_long_words=False,
                             break_on_hyphens=False) or [prefix.rstrip()]
    return "".join(line + "\n" for line in out)


# What a launcher sets for Megatron's TP on Hopper and what FSDP/ZeRO frameworks want instead
# (NVIDIA/Megatron-LM @d98e8a64ddf3 docs/user-guide/features/megatron_fsdp.md, "Recommended
# Configuration for Megatron-LM": unset it "to ensure stream independence /
# full-parallelization of FSDP computation and communication")
def no_connections_requirement(framework: str) -> str:
    """The environment comment of a target that reads no CUDA_DEVICE_MAX_CONNECTIONS
    (``framework``: its name): leave it unset, as the Megatron-FSDP user guide says for
    sharded data parallelism, even where a Megatron launch script sets 1."""
    return (f"environment: {framework} requires no variable; leave CUDA_DEVICE_MAX_CONNECTIONS "
            "unset (Megatron launch scripts set 1 for TP on Hopper; the Megatron-FSDP user "
            "guide unsets it 'to ensure stream independence' of sharded data-parallel "
            "communication and compute, which the estimate overlapped)")


RANK_ORDER_NOTE = ("rank order: Megatron's default tp-cp-ep-dp-pp (TP fastest, then CP, DP, PP), "
                   "the order the plan3d cost model assumed; see `plan3d placement`")


def theta_text(theta: float) -> str:
    """A RoPE base as written in exports: an integer when integral (500000.0 -> '500000'), else repr (10000.5 -> '10000.5')."""
    return str(int(theta)) if float(theta).is_integer() else repr(float(theta))


def rope_note(plan: Plan, where: str, default: str) -> str | None:
    """The comment an export writes about the RoPE base (ModelSpec.rope_theta) when the target
    does not take it as a setting: ``where`` says where the user sets it, ``default`` what applies
    when nothing sets it. None for models without RoPE."""
    model = plan.model
    if model.position_embedding != "rope":
        return None
    partial = (f"; RoPE rotates {model.rotary_percent:g} of each head's dimensions "
               "(rotary_percent): set that there too" if model.rotary_percent < 1.0 else "")
    if model.rope_theta is None:
        return (f"RoPE base: not set for {model.name} (rope_theta unknown), so {default} applies; "
                f"check it against the model you mean to train{partial}")
    return (f"RoPE base: this plan's model uses rope_theta {theta_text(model.rope_theta)}; set it in "
            f"{where}, or {default} applies{partial}")


def recompute_modules(model) -> list[str]:
    """Megatron-Core --recompute-modules for recompute=selective+: layernorm, moe_act for a model
    with experts, mla_up_proj for MLA (transformer_config.py L1940-2026: moe_act needs MoE layers,
    mla_up_proj MLA; moe.md 5.3)."""
    skip = {"moe_act"} if model.moe is None else set()
    if model.attention_kind != "mla":
        skip.add("mla_up_proj")
    return [m for m in SELECTIVE_PLUS_MODULES if m not in skip]


# ModelSpec fields that describe the architecture (the rest are its name, provenance and
# training defaults: the plan's own training settings are exported instead)
ARCHITECTURE_FIELDS = tuple(f for f in Plan.model_fields["model"].annotation.model_fields
                            if f not in ("name", "aliases", "source", "training", "notes"))


def field_values(plan: Plan, fields) -> str:
    """``field=value`` for each of ``fields`` that differs from ModelSpec's default, in schema
    order (nested blocks as field.key=value): one comment's worth, naming each field."""
    model = plan.model
    spec = type(model).model_fields
    out = []
    for f in ARCHITECTURE_FIELDS:
        value = getattr(model, f)
        if f not in fields or (not spec[f].is_required() and value == spec[f].default):
            continue
        if hasattr(value, "model_dump"):
            out += [f"{f}.{k}={v}" for k, v in value.model_dump(exclude_none=True).items()]
        else:
            out.append(f"{f}={value}")
    return ", ".join(out)


def unwritten_note(plan: Plan, target: str, written, where: str) -> str | None:
    """The comment naming the model fields ``target`` has no option for (all ARCHITECTURE_FIELDS
    not in ``written``), with this plan's values, and ``where`` they are set instead; None if
    every field that differs from its default is written."""
    rest = field_values(plan, [f for f in ARCHITECTURE_FIELDS if f not in set(written)])
    if not rest:
        return None
    return f"model fields {target} has no option for ({where}): {rest}"


def save_interval(plan: Plan) -> dict | None:
    """The plan's checkpoint (planner.cost.checkpoint.evaluate_checkpoint at the plan's
    estimated step time, as the ``checkpoint`` object of ``--json``): ``interval_steps`` is
    what exports set as the save interval, ``async`` whether saves are asynchronous. None
    when the plan's hardware profile lacks a block the estimate needs (storage, host link,
    host memory)."""
    if unavailable(plan.hardware):
        return None
    est = estimate_layout(plan.model, plan.hardware, plan.training, plan.layout)
    return evaluate_checkpoint(plan.model, plan.hardware, plan.training, est.candidates,
                               est.time["step"]).to_dict(0)


def interval_note(ck: dict | None, plan: Plan) -> str:
    """The comment every export writes about its save interval: the steps, the seconds they
    stand for, and the inputs of the optimum (formulas.md 12.4); or, without an estimate, why
    no interval is set."""
    if ck is None:
        return (f"checkpoint interval: not set, the hardware profile {plan.hardware.name} has no "
                "storage, host_link or host_memory block to estimate it from")
    mode = "an asynchronous" if ck["async"] else "a synchronous"
    return (f"checkpoint interval: every {ck['interval_steps']} steps, about "
            f"{fmt.seconds(ck['interval_s'])} of training (Young/Daly optimum "
            f"{fmt.seconds(ck['optimal_interval_s'])} for {mode} save stalling "
            f"{fmt.seconds(ck['blocking_s'])}, a job MTBF of {fmt.seconds(ck['mtbf_s'])} at "
            f"{fmt.number(ck['failures_per_gpu_s'] * 3600, 3)} failures per GPU-hour, "
            f"{fmt.seconds(ck['restart_s'])} to restart; expected goodput "
            f"{fmt.percent(ck['goodput'], 2)}; formulas.md 12); set the checkpoint directory yourself")
