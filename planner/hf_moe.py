"""Hugging Face config.json -> ModelSpec: mixture-of-experts, MLA, MTP, windows and the extra
attention weights (QK norms, sinks), by model_type (planner.hf_config calls ``architecture``).

Field meanings and layer patterns are those of the transformers model code @ 008e57439125
(GPT-OSS @ 02b8f42b4240):
- mixtral: every layer MoE, ``num_local_experts`` experts of ``intermediate_size``;
- qwen3_moe: layer i is MoE iff i not in ``mlp_only_layers`` and (i+1) % ``decoder_sparse_step``
  == 0; experts of ``moe_intermediate_size``; dense layers ``intermediate_size``; per-head
  q_norm/k_norm (RMSNorm(head_dim));
- deepseek_v2/v3: MLA (``q_lora_rank`` may be null), layer i is MoE iff i >=
  ``first_k_dense_replace`` and i % ``moe_layer_freq`` == 0, ``n_shared_experts`` shared experts
  of ``moe_intermediate_size``, ``num_nextn_predict_layers`` MTP modules (V3);
- gpt_oss: every layer MoE, biases on attention, experts and router, a sink per head,
  ``layer_types`` sliding_attention / full_attention with ``sliding_window``;
- olmoe: every layer MoE, q_norm/k_norm over the full q and k widths;
- llama4_text: ``moe_layers`` (default every ``interleave_moe_layer_step``-th layer), one shared
  expert of ``intermediate_size``, dense layers ``intermediate_size_mlp``, QK L2-norm without
  weights, chunked attention (noted, costed as full causal);
- mistral, mixtral: ``sliding_window`` on every layer; qwen2: on layers >= ``max_window_layers``
  when ``use_sliding_window``.
A layer pattern plan3d's moe block (first_dense_layers, layer_freq) cannot express is an error
naming the field.
"""

from __future__ import annotations

from .errors import UsageError
from .hf_fields import HFFields

MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "olmoe",
                "llama4_text")
EXPERTS_KEY = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts",
               "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts",
               "gpt_oss": "num_local_experts", "olmoe": "num_experts",
               "llama4_text": "num_local_experts"}
EXPERT_FFN_KEY = {"qwen3_moe": "moe_intermediate_size", "deepseek_v2": "moe_intermediate_size",
                  "deepseek_v3": "moe_intermediate_size"}   # the others: intermediate_size
DENSE_FFN_KEY = {"llama4_text": "intermediate_size_mlp"}      # the others: intermediate_size


def _int(f: HFFields, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise UsageError(f"{f.origin}: {key} must be an integer, got {value!r}")
    return int(value)


def _need(f: HFFields, key: str, least: int = 1) -> int:
    """A required integer field, at least ``least`` (UsageError naming it)."""
    value = _int(f, key, f.get(key, nullable=False))
    if value < least:
        raise UsageError(f"{f.origin}: {key} must be at least {least}, got {value}")
    return value


def fit_pattern(mask: list[bool]) -> tuple[int, int] | None:
    """(first_dense_layers, layer_freq) whose MoE pattern (model_schema.MoESpec) is ``mask``
    (True = MoE layer), or None if no such pair exists or no layer is MoE."""
    L = len(mask)
    first = next((i for i, moe in enumerate(mask) if moe), None)
    if first is None:
        return None
    for k in range(1, L + 1):
        f = first - k + 1
        if f >= 0 and [i >= f and (i - f + 1) % k == 0 for i in range(L)] == list(mask):
            return f, k
    return None


def _hf_moe_mask(f: HFFields, mt: str, L: int) -> tuple[list[bool], str]:
    """The family's MoE layers (True = MoE) and the fields that decide them."""
    if mt == "qwen3_moe":
        step = _need(f, "decoder_sparse_step")
        only = f.get("mlp_only_layers") or []
        return [i not in only and (i + 1) % step == 0 for i in range(L)], \
            "mlp_only_layers / decoder_sparse_step"
    if mt in ("deepseek_v2", "deepseek_v3"):
        first, freq = _need(f, "first_k_dense_replace", 0), _need(f, "moe_layer_freq")
        return [i >= first and i % freq == 0 for i in range(L)], \
            "first_k_dense_replace / moe_layer_freq"
    if mt == "llama4_text":
        step = _need(f, "interleave_moe_layer_step")
        layers = f.get("moe_layers")
        layers = list(range(step - 1, L, step)) if layers is None else layers
        return [i in layers for i in range(L)], "moe_layers / interleave_moe_layer_step"
    return [True] * L, "every layer"


def _moe(f: HFFields, mt: str, L: int) -> dict:
    """The moe block and the dense layers' ffn_hidden_size."""
    mask, fields = _hf_moe_mask(f, mt, L)
    pattern = fit_pattern(mask)
    if pattern is None:
        moe_layers = [i for i, m in enumerate(mask) if m]
        raise UsageError(f"{f.origin}: {fields} give MoE layers {moe_layers[:8]}"
                         f"{'...' if len(moe_layers) > 8 else ''}, a pattern plan3d's moe block "
                         "(first_dense_layers, then every layer_freq-th layer) cannot express")
    first, freq = pattern
    experts = _need(f, EXPERTS_KEY[mt])
    moe = {"num_experts": experts, "router_topk": _need(f, "num_experts_per_tok"),
           "ffn_hidden_size": _need(f, EXPERT_FFN_KEY.get(mt, "intermediate_size")),
           "first_dense_layers": first, "layer_freq": freq}
    if mt in ("deepseek_v2", "deepseek_v3"):
        moe["shared_experts"] = _need(f, "n_shared_experts", 0)
    elif mt == "llama4_text":
        moe["shared_experts"] = 1          # Llama4TextMoe.shared_expert (intermediate_size)
    out = {"moe": moe}
    if not all(mask):
        out["ffn_hidden_size"] = _need(f, DENSE_FFN_KEY.get(mt, "intermediate_size"))
    return out


def _mla(f: HFFields, mt: str) -> dict:
    """attention_type mla, the mla block and (V3) the MTP depth."""
    q = f.get("q_lora_rank")                  # required, may be null (DeepSeek-V2-Lite)
    out = {"attention_type": "mla", "num_kv_heads": None, "head_dim": None,
           "mla": {"q_lora_rank": None if q is None else _int(f, "q_lora_rank", q),
                   **{k: _need(f, k) for k in ("kv_lora_rank", "qk_nope_head_dim",
                                               "qk_rope_head_dim", "v_head_dim")}}}
    if f.get("attention_bias"):
        raise UsageError(f"{f.origin}: cannot map attention_bias=true with MLA (not modelled)")
    if mt == "deepseek_v3":
        out["mtp_layers"] = _need(f, "num_nextn_predict_layers", 0)
    return out


def _sliding_layers(f: HFFields, mt: str, L: int, notes: list[str]) -> list[int]:
    """0-based layers that attend over ``sliding_window`` (empty: none)."""
    types = f.cfg.get("layer_types")
    if types is None and mt == "gpt_oss":
        f.get("layer_types")                   # note the default: alternating, sliding first
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if types is not None:
        if not isinstance(types, list) or len(types) != L:
            raise UsageError(f"{f.origin}: layer_types must list one type per layer ({L})")
        unknown = sorted({t for t in types} - {"full_attention", "sliding_attention",
                                                 "chunked_attention"})
        if unknown or ("chunked_attention" in types and mt != "llama4_text"):
            bad = unknown[0] if unknown else "chunked_attention"
            raise UsageError(f"{f.origin}: cannot map layer_types {bad!r} (supported: "
                             "full_attention, sliding_attention)")
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    if mt in ("mistral", "mixtral"):
        return list(range(L)) if f.get("sliding_window") is not None else []
    if mt in ("qwen2", "qwen3_moe") and f.get("use_sliding_window"):
        if mt == "qwen3_moe":
            raise UsageError(f"{f.origin}: cannot map use_sliding_window=true for qwen3_moe "
                             "(its layers are not documented)")
        first = _need(f, "max_window_layers", 0)
        return list(range(first, L))
    return []


def _window(f: HFFields, mt: str, L: int, notes: list[str]) -> dict:
    layers = _sliding_layers(f, mt, L, notes)
    if not layers:
        return {}
    w = _need(f, "sliding_window")
    which = ("all" if layers == list(range(L)) else "even" if layers == list(range(0, L, 2))
             else "odd" if layers == list(range(1, L, 2)) else layers)
    return {"sliding_window": w, "window_layers": which}


def architecture(f: HFFields, mt: str, L: int, notes: list[str]) -> dict:
    """ModelSpec fields for MoE, MLA, MTP, windows, QK norms and sinks of model_type ``mt``
    (``L`` decoder layers); notes for what is not modelled. UsageError naming a field that is
    missing (with no checkpoint-independent default) or not representable."""
    out: dict = {}
    if mt in MOE_FAMILIES:
        out.update(_moe(f, mt, L))
    if mt in ("deepseek_v2", "deepseek_v3"):
        out.update(_mla(f, mt))
    if mt == "qwen3_moe":
        out["qk_norm"] = "per_head"
    if mt == "olmoe":
        out["qk_norm"] = "full"
    if mt == "gpt_oss":
        if not f.get("attention_bias"):
            raise UsageError(f"{f.origin}: cannot map attention_bias=false: GPT-OSS experts and "
                             "router have biases, which plan3d models together with attention's")
        out.update({"bias": True, "attention_sinks": True, "swiglu_limit": float(f.get("swiglu_limit"))})
        notes.append("GPT-OSS experts use a clamped SwiGLU (swiglu_alpha, swiglu_limit): "
                     "costed as swiglu with the clamp's own pass where the framework runs it")
    if mt == "llama4_text":
        chunk = f.get("attention_chunk_size")
        if chunk:
            notes.append(f"chunked attention ({chunk}-token chunks on the RoPE layers) costed as "
                         "full causal attention: exact up to that sequence length")
    out.update(_window(f, mt, L, notes))
    return out
