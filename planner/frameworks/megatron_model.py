"""Megatron-LM arguments for the architecture beyond a dense GPT: mixture-of-experts, expert
parallelism, MLA, MTP, sliding windows, QK norms, attention sinks, Q/K/V biases, norm epsilon.

Flag names and value formats are those of NVIDIA/Megatron-LM commit d98e8a64ddf3 (2026-08-22):
megatron/training/arguments.py (``--moe-layer-freq`` and ``--window-attn-skip-freq`` take
``moe_freq_type``: an int N or a Python list expression of digits, ``[ ] ( ) + *`` and commas,
evaluated by ``_eval_pattern``; ``--window-size`` takes ``tuple_type``, "a,b"); the other flags
are generated from megatron/core/transformer/transformer_config.py fields (num_moe_experts is
``--num-experts``; layernorm_epsilon is ``--norm-epsilon``).

Mapping (ModelSpec / Layout field -> flag):
  moe.num_experts, router_topk      --num-experts E, --moe-router-topk k
  moe.ffn_hidden_size               --moe-ffn-hidden-size F
  moe.shared_experts x shared width --moe-shared-expert-intermediate-size (one fused shared MLP)
  moe.first_dense_layers, layer_freq --moe-layer-freq: "1" when every layer is MoE, else the
                                    0/1 list (1 = MoE). Megatron's integer N means layers 0, N,
                                    2N, ... (gpt_layer_specs.py: i % N == 0), not plan3d's
                                    layer_freq (layers k-1, 2k-1, ... after the dense lead), so
                                    every other pattern is written as a list
  (plan)                            --moe-grouped-gemm
  layout moe_dispatcher             --moe-token-dispatcher-type alltoall | allgather, or flex
                                    with --moe-flex-dispatcher-backend deepep | hybridep
                                    (megatron_software; --moe-enable-deepep is deprecated at
                                    this commit, transformer_config.py L1743-1752)
  layout ep, etp                    --expert-model-parallel-size, --expert-tensor-parallel-size
                                    (always written: Megatron silently sets etp = tp otherwise,
                                    arguments.py L587-588)
  attention_type mla + mla block    --multi-latent-attention, --q-lora-rank (not when null),
                                    --kv-lora-rank, --qk-head-dim (qk_nope_head_dim),
                                    --qk-pos-emb-head-dim (qk_rope_head_dim), --v-head-dim,
                                    --qk-layernorm (MLA's q/kv latent norms, which model_counts
                                    counts; Megatron-Bridge's DeepSeek-V3 provider sets
                                    qk_layernorm = True), --rope-type rope --no-rope-fusion
                                    (MLA defaults to YaRN, and RoPE fusion with MLA needs YaRN:
                                    transformer_config.py MLATransformerConfig.__post_init__)
  mtp_layers                        --mtp-num-layers
  sliding_window w, window_layers   --window-size w-1,0 (Megatron-Bridge maps GPT-OSS's 128 to
                                    (127, 0)); --window-attn-skip-freq 2 for "even" (layer i is
                                    windowed iff (i+1) % 2 != 0, core/transformer/utils.py
                                    is_layer_window_attention), else the 0/1 list (1 = window)
  qk_norm per_head                  --qk-layernorm (per-head norm of head_dim); "full" (OLMoE)
                                    has no flag: a comment
  attention_sinks                   --softmax-type learnable
  qkv_bias                          --add-qkv-bias
  norm_epsilon                      --norm-epsilon (None: a comment that 1e-5 applies)
The software switches (software_args; megatron_software has the mapping and its sources):
  layout tp_comm_overlap            --tp-comm-overlap
  layout moe_a2a_overlap            --overlap-moe-expert-parallel-comm --delay-wgrad-compute
  layout cuda_graphs                --cuda-graph-impl transformer_engine --cuda-graph-modules
                                    ... | --cuda-graph-impl full_iteration
                                    --no-check-for-nan-in-loss-and-grad; --te-rng-tracker
  training moe_capacity_factor      --moe-expert-capacity-factor F
                                    --moe-pad-expert-input-to-capacity --moe-token-drop-policy probs
The job settings of the TrainingSpec (job_args; written for MoE models where MoE-only):
  optimizer_moment_bytes 2          --use-precision-aware-optimizer --exp-avg-dtype bf16
                                    --exp-avg-sq-dtype bf16 (optimizer_config.py L476-477)
  optimizer_offload_fraction f > 0  --optimizer-cpu-offload --optimizer-offload-fraction f
                                    --use-precision-aware-optimizer (arguments.py L1884-1887
                                    requires it)
  moe_activation_offload            --fine-grained-activation-offloading --offload-modules
                                    expert_fc1 moe_act
  cross_entropy_in_place            not written: Megatron-LM's validation refuses
                                    --cross-entropy-loss-fusion with --cross-entropy-fusion-impl
                                    te (arguments.py L1697-1702, "stability issues"); a comment
                                    and a note say so (Megatron-Bridge writes it)
Refused by the plan's rules before the export runs (search.job_rules, search.software_rules):
EP overlap with the allgather dispatcher or more than one MTP layer (transformer_config.py
L3016-3019, L3042-3046); optimizer CPU offload beside FP8 parameter gathering (arguments.py
L1888-1891); fine-grained beside whole-layer activation offloading (transformer_config.py
L2127-2130). Refused (UsageError): what megatron_software refuses (DeepEP over one expert rank
or padded to capacity, ...); E not divisible by ep (arguments.py L1655-1658); biases in MoE with
etp > 1 (transformer_config.py L2612-2615); attention TP > 1 without sequence parallelism in an
MoE model (moe/moe_layer.py L636-640 raises in training).
"""

from __future__ import annotations

import numpy as np

from ..cost.model_counts import has_dense_mlp, moe_layer_mask, window_layer_mask
from ..errors import UsageError
from ..inputs import flag
from ..plan import Plan
from .megatron_software import Software, megatron_software

# Megatron-Core TransformerConfig routing fields plan3d's model schema does not hold (a group is
# set together); both exports name them for the user to set from the model card
UNMODELLED_ROUTING = (("moe_router_score_function",), ("moe_router_enable_expert_bias",),
                      ("moe_router_num_groups", "moe_router_group_topk"),
                      ("moe_router_topk_scaling_factor",), ("moe_aux_loss_coeff",), ("moe_router_dtype",))


def unmodelled_routing(name=lambda field: field) -> str:
    """UNMODELLED_ROUTING as one comment's list, each field written by ``name`` (Megatron's
    planner.inputs.flag: --moe-router-dtype; Bridge's field name as is), a group joined by '/'."""
    return ", ".join("/".join(map(name, group)) for group in UNMODELLED_ROUTING)

Args = list[tuple[str, str | None]]


def layer_pattern(mask) -> str:
    """A 0/1 per-layer mask as the run-length Python list expression Megatron's
    ``_eval_pattern`` accepts: [F, F, F, T, T] -> "[0]*3+[1]*2" (single runs: "[0]+[1]*2")."""
    bits = [int(b) for b in np.asarray(mask, dtype=bool)]
    runs: list[tuple[int, int]] = []
    for b in bits:
        if runs and runs[-1][0] == b:
            runs[-1] = (b, runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return "+".join(f"[{b}]" if n == 1 else f"[{b}]*{n}" for b, n in runs)


# GPT-OSS's clamped SwiGLU: TransformerConfig fields without Megatron-LM flags (megatron/core/
# transformer/transformer_config.py L231-235 @d98e8a64; Megatron-Bridge's GPT-OSS provider sets
# them: activation quick_gelu with alpha 1.702, glu_linear_offset 1.0, the clamp)
CLAMP_NOTE = ("clamped SwiGLU (swiglu_limit {limit}): set activation_func_clamp_value={limit}, "
              "glu_linear_offset=1.0 and quick_gelu in the model provider (no Megatron-LM flag; "
              "Megatron-Bridge's GPT-OSS provider sets them)")


def _quoted(pattern: str) -> str:
    """A list expression quoted for the shell ([, ] and * are glob characters)."""
    return f"'{pattern}'"


def moe_args(plan: Plan) -> tuple[Args, list[str]]:
    """(flags, comments) of the MoE layers and the expert-parallel degrees; ([], []) for a
    dense model with ep = etp = 1. UsageError where Megatron would refuse the plan."""
    model, lay = plan.model, plan.layout
    if model.moe is None:
        if lay.ep > 1 or lay.etp > 1:
            raise UsageError(f"{model.name} has no MoE layers but the plan has ep={lay.ep} "
                             f"etp={lay.etp}; Megatron-LM needs --num-experts for expert parallelism")
        return [], []
    moe = model.moe
    if moe.num_experts % lay.ep:
        raise UsageError(f"Megatron-LM needs num_experts % expert-model-parallel-size == 0; "
                         f"{model.name} has {moe.num_experts} experts and the plan ep={lay.ep}")
    if model.bias and lay.etp > 1:
        raise UsageError(f"Megatron-Core supports biases in MoE layers only with expert tensor "
                         f"parallel 1 ({model.name} has biases; the plan has etp={lay.etp})")
    if lay.tp > 1 and not lay.sequence_parallel:
        raise UsageError("Megatron-Core's MoE layer refuses tensor parallelism without sequence "
                         f"parallelism in training; the plan has tp={lay.tp} without SP")
    mask = moe_layer_mask(model)
    freq = "1" if mask.all() else _quoted(layer_pattern(mask))
    args: Args = [("--num-experts", str(moe.num_experts)), ("--moe-router-topk", str(moe.router_topk)),
                  ("--moe-ffn-hidden-size", str(moe.ffn_hidden_size)), ("--moe-layer-freq", freq)]
    if moe.shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", str(moe.shared_experts * moe.shared_ffn)))
    sw = megatron_software(plan)
    args += [("--moe-grouped-gemm", None), ("--moe-token-dispatcher-type", sw.dispatcher_type)]
    if sw.flex_backend is not None:
        args.append(("--moe-flex-dispatcher-backend", sw.flex_backend))
    args += [("--expert-model-parallel-size", str(lay.ep)),
             ("--expert-tensor-parallel-size", str(lay.etp))]
    comments = [
        f"experts: {moe.num_experts} over ep={lay.ep} x etp={lay.etp} (edp={lay.edp}); "
        f"{'dropless' if sw.capacity_factor is None else 'drop-and-pad'} {lay.moe_dispatcher} "
        "dispatch with grouped GEMM, as the estimate assumed",
        "routing not in plan3d's model schema, set from the model card: " + unmodelled_routing(flag)]
    if moe.router_topk == 1:
        args.append(("--moe-router-pre-softmax", None))
        comments.append("top-1 routing: Megatron-Core requires --moe-router-pre-softmax with its "
                        "default softmax score function (transformer_config.py L2661-2669)")
    return args, comments


def software_args(plan: Plan, sw: Software | None = None) -> tuple[Args, list[str]]:
    """(flags, comments) of the plan's software switches but the dispatcher (moe_args):
    megatron_software's description as Megatron-LM flags (its docstring has the mapping)."""
    sw = sw or megatron_software(plan)
    args: Args = []
    if sw.tp_comm_overlap:
        args.append(("--tp-comm-overlap", None))
    if sw.a2a_overlap:
        args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    if sw.graph_impl != "none":
        args.append(("--cuda-graph-impl", sw.graph_impl))
        if sw.graph_modules:
            args.append(("--cuda-graph-modules", " ".join(sw.graph_modules)))
        if sw.graph_impl == "full_iteration":
            args.append(("--no-check-for-nan-in-loss-and-grad", None))
        args.append(("--te-rng-tracker", None))
    if sw.capacity_factor is not None:
        args += [("--moe-expert-capacity-factor", f"{sw.capacity_factor:g}"),
                 ("--moe-pad-expert-input-to-capacity", None), ("--moe-token-drop-policy", "probs")]
    return args, list(sw.comments)


def job_args(plan: Plan) -> tuple[Args, list[str]]:
    """(flags, comments) of the plan's job settings (module docstring): optimizer CPU offload,
    16-bit optimizer moments, MoE activation offload; the in-place cross entropy as a comment. What
    Megatron-LM refuses in them (offload beside FP8 parameter gathering, fine-grained beside
    whole-layer offload, ...) the plan's rules refuse before (search.job_rules)."""
    tr, model = plan.training, plan.model
    args: Args = []
    comments: list[str] = []
    if tr.optimizer_offload_fraction > 0:
        args += [("--optimizer-cpu-offload", None),
                 ("--optimizer-offload-fraction", f"{tr.optimizer_offload_fraction:g}")]
    if tr.optimizer_offload_fraction > 0 or tr.optimizer_moment_bytes == 2:
        args.append(("--use-precision-aware-optimizer", None))
    if tr.optimizer_moment_bytes == 2:  # bf16 Adam moments (optimizer_config.py L476-477: only
        # with the precision-aware optimizer)
        args += [("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if tr.moe_activation_offload and model.moe is not None:
        args += [("--fine-grained-activation-offloading", None),
                 ("--offload-modules", "expert_fc1 moe_act")]
        comments.append("activation offload: with Transformer Engine >= 2.10 set "
                        "NVTE_CPU_OFFLOAD_V1=1 (arguments.py L1935-1940)")
    if tr.cross_entropy_in_place:
        comments.append(CROSS_ENTROPY_NOTE)
    return args, comments


CROSS_ENTROPY_NOTE = (
    "the plan assumed Transformer Engine's in-place cross entropy (cross_entropy_in_place: 2 B "
    "per logit), but Megatron-LM refuses --cross-entropy-loss-fusion --cross-entropy-fusion-impl "
    "te (arguments.py L1697-1702); not written: its vocab-parallel cross entropy holds 6 B per "
    "logit, so re-estimate with cross_entropy_in_place false")


def attention_args(plan: Plan) -> tuple[Args, list[str]]:
    """(flags, comments) of MLA, QK norms, sinks, Q/K/V biases, sliding windows and MTP."""
    model = plan.model
    args: Args = []
    comments: list[str] = []
    if model.attention_kind == "mla":
        m = model.mla
        args.append(("--multi-latent-attention", None))
        if m.q_lora_rank is not None:
            args.append(("--q-lora-rank", str(m.q_lora_rank)))
        args += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_nope_head_dim)),
                 ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)), ("--v-head-dim", str(m.v_head_dim)),
                 ("--qk-layernorm", None), ("--rope-type", "rope"), ("--no-rope-fusion", None)]
        comments.append("MLA: --qk-layernorm adds the q/kv latent norms; plain RoPE (--rope-type "
                        "rope, which needs --no-rope-fusion with MLA); a YaRN context extension "
                        "is set with --rope-type yarn and its factors")
    if model.qk_norm == "per_head":
        args.append(("--qk-layernorm", None))
    elif model.qk_norm == "full":
        comments.append("QK norm over the whole q and k projections (qk_norm: full, OLMoE) has "
                        "no Megatron-LM flag (--qk-layernorm normalizes each head): it needs a "
                        "custom layer spec, as Megatron-Bridge's OLMoE provider")
    if model.attention_sinks:
        args.append(("--softmax-type", "learnable"))
    if model.swiglu_limit is not None:
        comments.append(CLAMP_NOTE.format(limit=f"{model.swiglu_limit:g}"))
    if model.qkv_bias:
        args.append(("--add-qkv-bias", None))
    if model.sliding_window is not None:
        args.append(("--window-size", f"{model.sliding_window - 1},0"))
        which = model.window_layers or "all"
        if which == "even":
            args.append(("--window-attn-skip-freq", "2"))
        elif which != "all":
            args.append(("--window-attn-skip-freq", _quoted(layer_pattern(window_layer_mask(model)))))
    if model.mtp_layers:
        args.append(("--mtp-num-layers", str(model.mtp_layers)))
        comments.append(f"MTP: {model.mtp_layers} module(s) on the last pipeline stage")
    return args, comments


def unused_dense_ffn(model, name: str) -> str | None:
    """The comment for an MoE model without a dense layer, whose dense MLP width (``name``: the
    target's option or field) is left out: the framework's default stands in, unused; None
    when some layer is dense (the width is written)."""
    if has_dense_mlp(model):
        return None
    stated = f" (the model's ffn_hidden_size {model.ffn_hidden_size})" if model.ffn_hidden_size else ""
    return (f"{name} not set{stated}: every layer is MoE, so no dense MLP uses it; the experts' "
            "width is the MoE option")


def model_args(plan: Plan) -> tuple[Args, list[str]]:
    """Every architecture and job-setting flag of this module for ``plan`` (flags, comments),
    duplicates dropped."""
    a1, c1 = attention_args(plan)
    a2, c2 = moe_args(plan)
    a3, c3 = job_args(plan)
    a4, c4 = software_args(plan)
    args: Args = []
    for option, value in a1 + a2 + a4 + a3:
        if all(option != f for f, _ in args):
            args.append((option, value))
    eps = plan.model.norm_epsilon
    if eps is not None:
        args.append(("--norm-epsilon", f"{eps:g}"))
    comments = c1 + c2 + c4 + c3
    unused = unused_dense_ffn(plan.model, "--ffn-hidden-size")
    if unused:
        comments.append(unused)
    if eps is None:
        comments.append(f"norm epsilon: not known for {plan.model.name} (norm_epsilon), so "
                        "Megatron-LM's default --norm-epsilon 1e-5 applies")
    return args, comments
