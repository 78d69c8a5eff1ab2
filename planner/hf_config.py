"""Read a Hugging Face transformers ``config.json`` as a plan3d ModelSpec.

Supported ``model_type``s: llama, mistral, qwen2 (gated SiLU MLP = SwiGLU, RMSNorm, RoPE),
gpt2 (learned positions, tied embeddings), gpt_neox (RoPE, biases), opt (learned positions,
ReLU MLP), falcon (multi-query / GQA, RoPE or ALiBi), bloom (ALiBi). Field names and the defaults
used when a field is absent are those of the transformers configuration classes
(LlamaConfig, MistralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig, OPTConfig, FalconConfig,
BloomConfig): e.g. ``tie_word_embeddings`` defaults to False for llama/mistral/qwen2/gpt_neox and
True for the others; ``n_inner: null`` means 4*hidden.

What plan3d's schema cannot represent exactly is either an error naming the field (MoE experts,
OPT's word_embed_proj_dim != hidden_size, an unknown activation) or, when the difference is only
a few parameters or a runtime detail, a sentence in ``notes`` (Qwen2's QKV biases, OPT's two
extra position rows, BLOOM's embedding LayerNorm, Falcon-7B's single LayerNorm per layer,
sliding-window attention, RoPE scaling). The RoPE base is read from ``rope_theta`` (GPT-NeoX:
``rotary_emb_base``) into ``ModelSpec.rope_theta``, ``rotary_pct`` / ``partial_rotary_factor`` into
``ModelSpec.rotary_percent``.

Training defaults (a config.json has none): seq_length = min(max_position_embeddings, 8192)
(2048 when the model has no position limit, e.g. ALiBi); global_batch_size = 2^22 tokens /
seq_length (about the 4M-token batches of Llama 2/3), at least 1. Both are written in ``notes``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .catalog import refuse_plan, validate
from .errors import UsageError
from .specs import ModelSpec

FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "opt", "falcon", "bloom")
GATED = {"llama", "mistral", "qwen2"}
TIE_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "gpt_neox": False,
               "gpt2": True, "opt": True, "falcon": True, "bloom": True}
SYNONYMS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "vocab_size": ("vocab_size",),
}
GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate"}
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop",
                  "dropout", "hidden_dropout_prob", "attention_probs_dropout_prob")
MAX_SEQ = 8192
BATCH_TOKENS = 2**22


def _first(cfg: dict, keys: tuple[str, ...]):
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


def _int(origin: str, key: str | None, value) -> int | None:
    """``value`` of config field ``key`` as an int (None stays None). A float with an integral
    value (4096.0) is accepted; anything else (a string, a bool, 4096.5) is a UsageError naming
    the field, since int() would truncate or misread it."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise UsageError(f"{origin}: {key} must be an integer, got {value!r}")


def _float(origin: str, key: str, value) -> float | None:
    """``value`` of config field ``key`` as a float (None stays None); UsageError naming the field
    for a string or a bool."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise UsageError(f"{origin}: {key} must be a number, got {value!r}")


def _rope_theta(cfg: dict, origin: str, notes: list[str]) -> float:
    """The RoPE base of a RoPE model's config: ``rope_theta`` (llama, mistral, qwen2, falcon),
    ``rotary_emb_base`` (gpt_neox), or ``rope_parameters.rope_theta`` (transformers v5 layout).
    Absent: 10000.0, the default of every supported transformers config class (LlamaConfig,
    MistralConfig, Qwen2Config, FalconConfig rope_theta; GPTNeoXConfig rotary_emb_base), with a
    note. UsageError naming the field if it is not a positive number."""
    params = cfg.get("rope_parameters")
    for key, value in (("rope_theta", cfg.get("rope_theta")),
                       ("rotary_emb_base", cfg.get("rotary_emb_base")),
                       ("rope_parameters.rope_theta",
                        params.get("rope_theta") if isinstance(params, dict) else None)):
        theta = _float(origin, key, value)
        if theta is not None:
            if not theta > 0 or theta == float("inf"):
                raise UsageError(f"{origin}: {key} must be a positive number, got {value!r}")
            return theta
    notes.append("rope_theta not given: 10000 assumed (the transformers default)")
    return 10000.0


def _rotary_percent(cfg: dict, origin: str) -> float | None:
    """The share of each head RoPE rotates: ``rotary_pct`` (gpt_neox) or ``partial_rotary_factor``
    (Phi, StableLM, GLM); None when absent (all of it). UsageError outside (0, 1]."""
    for key in ("rotary_pct", "partial_rotary_factor"):
        value = _float(origin, key, cfg.get(key))
        if value is not None:
            if not 0 < value <= 1:
                raise UsageError(f"{origin}: {key} must be in (0, 1], got {cfg[key]!r}")
            return value
    return None


def from_hf_dict(cfg: dict, origin: str, name: str) -> ModelSpec:
    """ModelSpec from a parsed config.json. UsageError naming the fields it cannot map."""
    mt = cfg.get("model_type")
    if mt not in FAMILIES:
        raise UsageError(f"{origin}: model_type {mt!r} is not supported (supported: "
                         f"{', '.join(FAMILIES)})")
    bad = [f"{k}={cfg[k]}" for k in MOE_FIELDS if cfg.get(k)]
    if bad:
        raise UsageError(f"{origin}: cannot map {', '.join(bad)}: plan3d models dense decoders only")
    shape = {}
    for field, keys in SYNONYMS.items():
        key, value = _first(cfg, keys)
        if value is None:
            raise UsageError(f"{origin}: missing {' / '.join(keys)}")
        shape[field] = _int(origin, key, value)
    h, a = shape["hidden_size"], shape["num_attention_heads"]
    notes: list[str] = []

    # attention: KV heads and head dim
    kv = _int(origin, "num_key_value_heads", cfg.get("num_key_value_heads"))
    if mt == "falcon":
        if cfg.get("new_decoder_architecture"):
            kv = _int(origin, "num_kv_heads", cfg.get("num_kv_heads", a))
        elif cfg.get("multi_query", True):
            kv = 1
        if cfg.get("parallel_attn", True) and not cfg.get("new_decoder_architecture"):
            notes.append(f"Falcon parallel attention with one LayerNorm per layer: counted as two, "
                         f"{2 * h * shape['num_layers']:,} parameters too many")
    head_dim = _int(origin, "head_dim", cfg.get("head_dim"))

    # MLP
    act_key, act = _first(cfg, ("hidden_act", "activation_function"))
    act = act or ("silu" if mt in GATED else "gelu")
    if mt in GATED:
        if act not in ("silu", "swish"):
            raise UsageError(f"{origin}: cannot map {act_key}={act!r}: gated MLPs are modeled as "
                             "SwiGLU (silu) only")
        activation = "swiglu"
    elif act in GELU:
        activation = "gelu"
    elif act == "relu":
        activation = "gelu"
        notes.append("ReLU MLP modeled as gelu (same parameter count and FLOPs)")
    else:
        raise UsageError(f"{origin}: cannot map {act_key}={act!r} (supported: silu with a gated "
                         "MLP, gelu variants, relu)")
    ffn_key, ffn = _first(cfg, ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"))
    ffn = _int(origin, ffn_key, ffn) or 4 * h
    if mt == "opt" and _int(origin, "word_embed_proj_dim", cfg.get("word_embed_proj_dim", h)) != h:
        raise UsageError(f"{origin}: cannot map word_embed_proj_dim={cfg['word_embed_proj_dim']} "
                         f"!= hidden_size {h} (OPT projection layers are not modeled)")

    # positions
    pos_key, max_pos = _first(cfg, ("max_position_embeddings", "n_positions", "max_seq_len"))
    max_pos = _int(origin, pos_key, max_pos)
    if mt in ("gpt2", "opt"):
        position = "learned"
        if mt == "opt":
            notes.append(f"OPT's learned position table has 2 extra rows (offset 2): "
                         f"{2 * h:,} parameters not counted")
    elif mt == "bloom" or (mt == "falcon" and cfg.get("alibi")):
        position = "alibi"
        if mt == "bloom":
            notes.append(f"BLOOM's embedding LayerNorm ({2 * h:,} parameters) is not counted")
    else:
        position = "rope"
    rope_theta = _rope_theta(cfg, origin, notes) if position == "rope" else None
    rotary = _rotary_percent(cfg, origin) if position == "rope" else None
    if cfg.get("rope_scaling"):
        notes.append(f"rope_scaling {cfg['rope_scaling']} is not modeled by plan3d (no cost effect) "
                     "and not exported: set it in the training framework")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", mt == "mistral"):
        notes.append(f"sliding-window attention ({cfg['sliding_window']} tokens) costed as full "
                     "causal attention")

    # norms, biases, embeddings, dropout
    norm = "rmsnorm" if mt in GATED else "layernorm"
    if mt in GATED:
        bias = bool(cfg.get("attention_bias", False)) and bool(cfg.get("mlp_bias", False))
        if bool(cfg.get("attention_bias", False)) != bool(cfg.get("mlp_bias", False)):
            notes.append("attention_bias and mlp_bias differ: biases not modeled")
        if mt == "qwen2":
            d = head_dim or h // a
            notes.append(f"Qwen2's Q/K/V biases ({(a + 2 * (kv or a)) * d * shape['num_layers']:,} "
                         "parameters) are not modeled")
    elif mt == "falcon":
        bias = bool(cfg.get("bias", False))
    elif mt == "opt":
        bias = bool(cfg.get("enable_bias", True))
    else:
        bias = bool(cfg.get("attention_bias", cfg.get("use_bias", True)))
    tie = bool(cfg.get("tie_word_embeddings", TIE_DEFAULT[mt]))
    drops = {k: _float(origin, k, cfg[k]) for k in DROPOUT_FIELDS if cfg.get(k) is not None}
    dropout = max(drops.values(), default=0.0)
    if len(set(drops.values())) > 1:
        notes.append(f"dropout rates {drops} differ; using the largest, {dropout:g}")

    seq = min(max_pos, MAX_SEQ) if max_pos else 2048
    gbs = max(1, BATCH_TOKENS // seq)
    why = f"min(max_position_embeddings, {MAX_SEQ})" if max_pos else "no position limit given"
    notes.append(f"training defaults chosen by plan3d (config.json has none): seq_length {seq} "
                 f"({why}), global_batch_size {gbs} (2^22 tokens / seq_length)")
    data = {
        "name": name, "source": f"Hugging Face config {origin} (model_type {mt})",
        **shape, "num_kv_heads": kv if kv and kv != a else None,
        "head_dim": head_dim if head_dim and head_dim * a != h else None,
        "ffn_hidden_size": ffn, "activation": activation, "tie_embeddings": tie, "norm": norm,
        "bias": bias, "position_embedding": position,
        "max_position_embeddings": max_pos or None, "rope_theta": rope_theta,
        "rotary_percent": rotary, "dropout": dropout,
        "training": {"seq_length": seq, "global_batch_size": gbs}, "notes": "; ".join(notes),
    }
    return validate(ModelSpec, {k: v for k, v in data.items() if v is not None}, origin)


def load_hf_config(path: Path) -> ModelSpec:
    """ModelSpec from a config.json file; UsageError (one line) on unreadable or unmappable input."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    refuse_plan(cfg, str(path))
    name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json" and
                                        path.parent.name else path.stem)
    return from_hf_dict(cfg, str(path), str(name))
