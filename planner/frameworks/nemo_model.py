"""The model fields of a Megatron-Bridge model provider for a plan's model (``model.*``).

Megatron-Bridge's providers (``GPTModelProvider``, and ``MLAModelProvider`` for MLA) are
Megatron-Core ``TransformerConfig`` dataclasses, so a provider field has the TransformerConfig
name. Field names were checked in NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b
src/megatron/bridge/models/conversion/model_bridge.py ``CONFIG_MAPPING`` (num_layers,
hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels, vocab_size,
layernorm_epsilon, attention_dropout, hidden_dropout, share_embeddings_and_output_weights,
add_qkv_bias, add_bias_linear, qk_layernorm, rotary_base, rotary_percent, num_moe_experts,
moe_router_topk, moe_ffn_hidden_size, q_lora_rank, kv_lora_rank, qk_head_dim,
qk_pos_emb_head_dim, v_head_dim, mtp_num_layers), src/megatron/bridge/models/gpt_provider.py
(normalization, position_embedding_type, moe_grouped_gemm) and the DeepSeek-V3 and GPT-OSS
bridges (deepseek/deepseek_v3_bridge.py: gated_linear_unit, multi_latent_attention,
moe_token_dispatcher_type, moe_layer_freq as a 0/1 list, moe_shared_expert_intermediate_size,
apply_rope_fusion; gpt_oss/gpt_oss_bridge.py: softmax_type "learnable", window_size
(w - 1, 0), window_attn_skip_freq 2), with Megatron-Core's layer-pattern semantics
(megatron_model's docstring). Layout: expert_model_parallel_size, expert_tensor_parallel_size.

The software switches (software_fields: megatron_software's description as Bridge fields; its
docstring has the mapping and the sources): model.moe_token_dispatcher_type (+
model.moe_flex_dispatcher_backend for flex), comm_overlap.tp_comm_overlap (always written: a
recipe may turn it on; CommOverlapConfig.tp_comm_overlap has no default, training/
comm_overlap.py L384 @ 067f987df03b), comm_overlap.overlap_moe_expert_parallel_comm and
comm_overlap.delay_wgrad_compute (with model.moe_shared_expert_overlap false when on),
model.cuda_graph_impl (with graphs: model.cuda_graph_modules, model.cuda_graph_scope null and
rng.te_rng_tracker; rerun_state_machine.check_for_nan_in_loss false for a full-iteration graph),
model.moe_expert_capacity_factor, model.moe_pad_expert_input_to_capacity,
model.moe_token_drop_policy. Every switch is written whether on or off, so a recipe's own
setting (Llama 3 70B's userbuffers, Qwen3-235B's EP overlap, DeepSeek-V3's graphs) does not
stay in force unseen.
The job settings of the TrainingSpec (job_fields), as Megatron-Bridge's performance recipes set
them (NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b src/megatron/bridge/perf_recipes/deepseek/
common.py, b200/deepseek_v3.py, gb200/deepseek_v3.py, gb200/deepseek_v4.py):
optimizer_offload_fraction -> optimizer.optimizer_cpu_offload,
optimizer.optimizer_offload_fraction, optimizer.use_precision_aware_optimizer (Megatron-Core
OptimizerConfig, optimizer_config.py L187, L347-350 @ d98e8a64ddf3); moe_activation_offload ->
model.fine_grained_activation_offloading, model.offload_modules [expert_fc1, moe_act];
cross_entropy_in_place -> model.cross_entropy_loss_fusion true, model.cross_entropy_fusion_impl
te (as the DeepSeek-V3 bridge sets it, models/deepseek/deepseek_v3_bridge.py L82; Megatron-Core
only warns about it, model_parallel_config.py L536-542, where Megatron-LM's own arguments refuse
it).

Not expressible as a YAML field: the activation function (a callable; SwiGLU = gated_linear_unit
with activation_func F.silu set in the provider's Python) and full-width QK norms (a layer spec):
comments.
"""

from __future__ import annotations

from ..cost.model_counts import has_dense_mlp, moe_layer_mask, window_layer_mask
from ..plan import Plan
from .megatron_model import CLAMP_NOTE
from .megatron_model import unmodelled_routing, unused_dense_ffn
from .megatron_software import Software, megatron_software

POSITION = {"rope": "rope", "learned": "learned_absolute"}


def _moe_fields(plan: Plan) -> dict[str, object]:
    moe, lay = plan.model.moe, plan.layout
    out: dict[str, object] = {"expert_model_parallel_size": lay.ep,
                              "expert_tensor_parallel_size": lay.etp}
    if moe is None:
        return out
    mask = moe_layer_mask(plan.model)
    out.update({"num_moe_experts": moe.num_experts, "moe_router_topk": moe.router_topk,
                "moe_ffn_hidden_size": moe.ffn_hidden_size,
                "moe_layer_freq": 1 if mask.all() else [int(b) for b in mask],
                "moe_shared_expert_intermediate_size":
                    moe.shared_experts * moe.shared_ffn if moe.shared_experts else None,
                "moe_grouped_gemm": True})
    if moe.router_topk == 1:
        out["moe_router_pre_softmax"] = True
    return out


def _attention_fields(plan: Plan) -> dict[str, object]:
    m = plan.model
    out: dict[str, object] = {}
    if m.attention_kind == "mla":
        out.update({"multi_latent_attention": True, "q_lora_rank": m.mla.q_lora_rank,
                    "kv_lora_rank": m.mla.kv_lora_rank, "qk_head_dim": m.mla.qk_nope_head_dim,
                    "qk_pos_emb_head_dim": m.mla.qk_rope_head_dim, "v_head_dim": m.mla.v_head_dim,
                    "qk_layernorm": True, "rope_type": "rope", "apply_rope_fusion": False})
    else:
        out.update({"num_query_groups": m.kv_heads, "kv_channels": m.kv_channels,
                    "qk_layernorm": m.qk_norm == "per_head"})
    if m.attention_sinks:
        out["softmax_type"] = "learnable"
    if m.sliding_window is not None:
        out["window_size"] = [m.sliding_window - 1, 0]
        which = m.window_layers or "all"
        out["window_attn_skip_freq"] = (None if which == "all" else 2 if which == "even"
                                        else [int(b) for b in window_layer_mask(m)])
    if m.mtp_layers:
        out["mtp_num_layers"] = m.mtp_layers
    return out


def model_fields(plan: Plan, vocab: int) -> dict[str, object]:
    """{provider field: value} of the plan's model and expert-parallel degrees (None = the
    field's None); ``vocab`` is the padded vocabulary the plan was costed with. A value plan3d
    does not know (norm epsilon, a RoPE base that is not an integer) is left out, so the
    provider's default applies (a comment says so): null would replace a float or int field."""
    m = plan.model
    out: dict[str, object] = {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        **({"ffn_hidden_size": m.ffn} if has_dense_mlp(m) else {}),
        "num_attention_heads": m.num_attention_heads, "vocab_size": vocab,
        "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        "gated_linear_unit": m.activation == "swiglu", "add_bias_linear": m.bias,
        "add_qkv_bias": m.bias or m.qkv_bias,
        "share_embeddings_and_output_weights": m.tie_embeddings,
        "attention_dropout": m.dropout, "hidden_dropout": m.dropout,
    }
    if m.norm_epsilon is not None:
        out["layernorm_epsilon"] = m.norm_epsilon
    if m.position_embedding in POSITION:
        out["position_embedding_type"] = POSITION[m.position_embedding]
    if m.position_embedding == "rope":
        if m.rope_theta is not None and float(m.rope_theta).is_integer():
            out["rotary_base"] = int(m.rope_theta)
        out["rotary_percent"] = m.rotary_percent
    out.update(_attention_fields(plan))
    out.update(_moe_fields(plan))
    return out


def software_fields(plan: Plan, sw: Software | None = None) -> dict[str, dict[str, object]]:
    """{section: {field: value}} of the plan's software switches (module docstring):
    ``model``, ``comm_overlap``, ``rng`` and ``rerun_state_machine`` entries. UsageError where
    Megatron-Core refuses them (megatron_software)."""
    sw = sw or megatron_software(plan)
    model: dict[str, object] = {}
    overlap: dict[str, object] = {"tp_comm_overlap": sw.tp_comm_overlap}
    out: dict[str, dict[str, object]] = {"model": model, "comm_overlap": overlap}
    if sw.dispatcher_type is not None:  # an MoE model
        model["moe_token_dispatcher_type"] = sw.dispatcher_type
        if sw.flex_backend is not None:
            model["moe_flex_dispatcher_backend"] = sw.flex_backend
        overlap.update(overlap_moe_expert_parallel_comm=sw.a2a_overlap, delay_wgrad_compute=sw.a2a_overlap)
        if sw.a2a_overlap:
            model["moe_shared_expert_overlap"] = False
        dropping = sw.capacity_factor is not None
        model.update(moe_expert_capacity_factor=sw.capacity_factor,
                     moe_pad_expert_input_to_capacity=dropping, moe_token_drop_policy="probs")
    model["cuda_graph_impl"] = sw.graph_impl  # none: Bridge clears the modules itself
    if sw.graph_impl != "none":  # (utils/cuda_graph.py validate_cuda_graph_configuration)
        model.update(cuda_graph_modules=list(sw.graph_modules), cuda_graph_scope=None)
        out["rng"] = {"te_rng_tracker": True}
    if sw.graph_impl == "full_iteration":
        out["rerun_state_machine"] = {"check_for_nan_in_loss": False}
    return out


def job_fields(plan: Plan) -> dict[str, dict[str, object]]:
    """{section: {field: value}} of the plan's job settings (module docstring): ``model`` and
    ``optimizer`` entries, only those that are set."""
    tr, moe = plan.training, plan.model.moe is not None
    out: dict[str, dict[str, object]] = {"model": {}, "optimizer": {}}
    if tr.optimizer_offload_fraction > 0:
        out["optimizer"].update(optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                                optimizer_offload_fraction=float(tr.optimizer_offload_fraction))
    if tr.optimizer_moment_bytes == 2:  # Bridge turns "torch.bfloat16" back into the dtype
        # (training/utils/omegaconf_utils.py L498-503 @067f987df)
        out["optimizer"].update(use_precision_aware_optimizer=True, exp_avg_dtype="torch.bfloat16",
                                exp_avg_sq_dtype="torch.bfloat16")
    if tr.moe_activation_offload and moe:
        out["model"].update(fine_grained_activation_offloading=True,
                            offload_modules=["expert_fc1", "moe_act"])
    if tr.cross_entropy_in_place:
        out["model"].update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    return {k: v for k, v in out.items() if v}


def model_comments(plan: Plan) -> list[str]:
    """What the provider fields cannot say (written as comments)."""
    m = plan.model
    out = []
    if m.activation == "swiglu":
        out.append("SwiGLU: gated_linear_unit true with activation_func = F.silu, a callable set "
                   "in the provider's Python (not a YAML field)")
    if m.swiglu_limit is not None:
        out.append(CLAMP_NOTE.format(limit=f"{m.swiglu_limit:g}"))
    if m.qk_norm == "full":
        out.append("QK norm over the whole q and k projections (qk_norm: full, OLMoE): a custom "
                   "layer spec, as Megatron-Bridge's OLMoE provider")
    unused = unused_dense_ffn(m, "ffn_hidden_size")
    if unused:
        out.append(unused)
    if m.norm_epsilon is None:
        out.append(f"norm epsilon: not known for {m.name}; the provider's layernorm_epsilon "
                   "(Megatron-Core default 1e-5) applies")
    if m.moe is not None:
        out.append("routing not in plan3d's model schema, set from the model card: "
                   + unmodelled_routing())
    return out
