"""Read a Hugging Face transformers ``config.json`` as a plan3d ModelSpec.

Supported ``model_type``s: dense llama, mistral, qwen2 (gated SiLU MLP = SwiGLU, RMSNorm, RoPE;
mistral's sliding window), gpt2 (learned positions, tied embeddings), gpt_neox (RoPE, biases),
opt (learned positions, ReLU MLP), falcon (multi-query / GQA, RoPE or ALiBi), bloom (ALiBi);
mixture-of-experts mixtral, qwen3_moe, deepseek_v2 / deepseek_v3 (MLA, dense first layers,
shared experts, MTP), gpt_oss (biases, attention sinks, alternating sliding window), olmoe
(full-width QK norms), llama4 / llama4_text (the text model; interleaved MoE layers, a shared
expert). planner.hf_moe maps the MoE, MLA, MTP and window fields.

Missing fields (planner.hf_fields): a field whose transformers default is the size of one
checkpoint (intermediate_size, head counts, expert counts, MLA ranks) is a one-line error naming
it; a switch or rule (tie_word_embeddings, num_key_value_heads = heads, Mistral's
sliding_window 4096, GPT-NeoX's rotary_pct 0.25) takes the configuration class's default and
the model's notes list every default taken.

What plan3d's schema cannot represent exactly is either an error naming the field (a MoE field
in a dense family, OPT's word_embed_proj_dim != hidden_size, an unknown activation, a MoE layer
pattern the moe block cannot express) or, when the difference is only a few parameters or a
runtime detail, a sentence in ``notes`` (OPT's two extra position rows,
BLOOM's embedding LayerNorm, Falcon-7B's single LayerNorm per layer, RoPE scaling, Llama 4's
chunked attention and vision encoder). The RoPE base is read from ``rope_theta`` (GPT-NeoX:
``rotary_emb_base``) into ``ModelSpec.rope_theta``, ``rotary_pct`` / ``partial_rotary_factor``
into ``ModelSpec.rotary_percent``. Qwen2's Q/K/V biases (Qwen2Attention: q/k/v bias=True, o
bias=False) are ``qkv_bias``; the norms' epsilon ``rms_norm_eps`` / ``layer_norm_epsilon`` /
``layer_norm_eps`` is ``norm_epsilon`` (absent: None and a note).

Training defaults (a config.json has none): seq_length = min(max_position_embeddings, 8192)
(2048 when the model has no position limit, e.g. ALiBi); global_batch_size = 2^22 tokens /
seq_length (about the 4M-token batches of Llama 2/3), at least 1. Both are written in ``notes``.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import hf_moe
from .files import refuse_other_kind, validate
from .errors import UsageError
from .hf_fields import CLASSES, DEFAULTS, ROPE_THETA, HFFields
from .specs import ModelSpec

FAMILIES = tuple(CLASSES) + ("llama4",)
GATED = {"llama", "mistral", "qwen2", *hf_moe.MOE_FAMILIES}
SYNONYMS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "vocab_size": ("vocab_size",),
}
GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate"}
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
ACT_KEY = {"gpt2": "activation_function", "opt": "activation_function", "falcon": "activation"}
FFN_KEY = {"gpt2": "n_inner", "opt": "ffn_dim", "falcon": "ffn_hidden_size"}
DROPOUT_KEYS = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
                "opt": ("dropout", "attention_dropout"),
                "gpt_neox": ("attention_dropout", "hidden_dropout"),
                "falcon": ("hidden_dropout", "attention_dropout"),
                "bloom": ("hidden_dropout", "attention_dropout")}
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


def _rope_theta(cfg: dict, origin: str, notes: list[str], family: str) -> float:
    """The RoPE base of a RoPE model's config: ``rope_theta`` (llama, mistral, qwen2, falcon, MoE
    families), ``rotary_emb_base`` (gpt_neox), or ``rope_parameters.rope_theta`` (transformers v5
    layout). Absent: the class's default (10000.0; MixtralConfig 1e6, GptOssConfig 150000,
    Llama4TextConfig 500000), with a note. UsageError naming the field if not a positive number."""
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
    theta = ROPE_THETA.get(family, 10000.0)
    notes.append(f"rope_theta not given: {theta:g} assumed (the transformers default)")
    return theta


def _rotary_percent(f: HFFields, mt: str) -> float | None:
    """The share of each head RoPE rotates: ``rotary_pct`` (gpt_neox; absent: GPTNeoXConfig's
    0.25, noted) or ``partial_rotary_factor`` (Phi, StableLM, GLM); None when absent (all of it).
    UsageError outside (0, 1]."""
    for key in ("rotary_pct", "partial_rotary_factor"):
        raw = f.get(key) if (key == "rotary_pct" and mt == "gpt_neox") else f.cfg.get(key)
        value = _float(f.origin, key, raw)
        if value is not None:
            if not 0 < value <= 1:
                raise UsageError(f"{f.origin}: {key} must be in (0, 1], got {raw!r}")
            return value
    return None


def _unwrap(cfg: dict, origin: str, notes: list[str]) -> dict:
    """Llama 4's multimodal config: its ``text_config`` as a llama4_text config."""
    if cfg.get("model_type") != "llama4":
        return cfg
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise UsageError(f"{origin}: model_type llama4 needs a text_config mapping")
    notes.append("Llama 4: the text model of the checkpoint; the vision encoder is not counted")
    return {**text, "model_type": "llama4_text"}


def _attention(f: HFFields, mt: str, a: int, h: int, L: int, notes: list[str]) -> tuple:
    """(KV heads or None, head_dim or None) of the family."""
    cfg, origin = f.cfg, f.origin
    if mt in ("deepseek_v2", "deepseek_v3"):
        return None, None                                      # MLA: hf_moe
    if mt == "falcon":
        kv = a
        if f.get("new_decoder_architecture"):
            kv = _int(origin, "num_kv_heads", f.get("num_kv_heads")) or a
        elif f.get("multi_query"):
            kv = 1
        if f.get("parallel_attn") and not f.get("new_decoder_architecture"):
            notes.append(f"Falcon parallel attention with one LayerNorm per layer: counted as two, "
                         f"{2 * h * L:,} parameters too many")
        return kv, None
    if mt in ("gpt2", "opt", "bloom", "gpt_neox"):
        return None, _int(origin, "head_dim", cfg.get("head_dim"))
    # None (llama, olmoe: = heads) is a rule; a fixed class default (Mistral's 8) is required
    rule = DEFAULTS[mt]["num_key_value_heads"] is None
    kv = _int(origin, "num_key_value_heads", f.get("num_key_value_heads", nullable=rule))
    if "head_dim" in DEFAULTS[mt]:
        rule = DEFAULTS[mt]["head_dim"] is None
        head_dim = f.get("head_dim", nullable=rule)
    else:
        head_dim = cfg.get("head_dim")
    return kv, _int(origin, "head_dim", head_dim)


def _mlp(f: HFFields, mt: str, h: int, notes: list[str]) -> tuple[str, int | None]:
    """(activation, dense ffn width or None for an all-MoE model)."""
    origin = f.origin
    act_key = ACT_KEY.get(mt, "hidden_act")
    act = "gelu" if mt == "bloom" else f.get(act_key)
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
    if mt in hf_moe.MOE_FAMILIES:
        return activation, None                                # hf_moe: dense layers' width
    if mt == "bloom":
        return activation, 4 * h
    key = FFN_KEY.get(mt, "intermediate_size")
    ffn = _int(origin, key, f.get(key, nullable=key not in ("intermediate_size", "ffn_dim")))
    return activation, ffn or 4 * h


def _bias(f: HFFields, mt: str, a: int, kv: int | None, d: int, L: int, notes: list[str]) -> bool:
    if mt in ("gpt2", "bloom"):
        return True
    if mt == "falcon":
        return _bool(f.origin, "bias", f.get("bias"))
    if mt == "opt":
        return _bool(f.origin, "enable_bias", f.get("enable_bias"))
    if mt == "gpt_neox":
        key = "attention_bias" if "use_bias" not in f.cfg else "use_bias"
        return _bool(f.origin, key, f.get(key) if key == "attention_bias" else f.cfg[key])
    if mt in hf_moe.MOE_FAMILIES:
        return False                                           # gpt_oss: hf_moe sets it
    attn = _bool(f.origin, "attention_bias", f.get("attention_bias") if mt == "llama"
                 else f.cfg.get("attention_bias"))
    mlp = _bool(f.origin, "mlp_bias", f.get("mlp_bias") if mt == "llama" else f.cfg.get("mlp_bias"))
    if attn != mlp:
        notes.append("attention_bias and mlp_bias differ: biases not modeled")
    return attn and mlp


EPS_KEY = {"gpt2": "layer_norm_epsilon", "bloom": "layer_norm_epsilon", "falcon": "layer_norm_epsilon",
           "gpt_neox": "layer_norm_eps", "opt": None}


def _norm_epsilon(f: HFFields, mt: str, notes: list[str]) -> float | None:
    """The norms' epsilon: ``rms_norm_eps`` (gated families), ``layer_norm_epsilon`` (GPT-2,
    BLOOM, Falcon) or ``layer_norm_eps`` (GPT-NeoX). Absent (or OPT, whose config has no such
    field): None, with a note that the training framework's default applies (no class default
    is taken: it is a training setting the checkpoint fixes). UsageError outside (0, 1)."""
    key = EPS_KEY.get(mt, "rms_norm_eps")
    value = _float(f.origin, key, f.cfg.get(key)) if key else None
    if value is None:
        notes.append(f"norm epsilon not in config.json ({key or 'OPTConfig has no field'}): "
                     "exports leave the training framework's default")
        return None
    if not 0 < value < 1:
        raise UsageError(f"{f.origin}: {key} must be in (0, 1), got {value!r}")
    return value


def _positions(f: HFFields, mt: str, h: int, notes: list[str]) -> tuple[str, int | None]:
    """(position_embedding, max_position_embeddings or None)."""
    max_pos = None
    if mt != "bloom":
        key = "n_positions" if mt == "gpt2" else "max_position_embeddings"
        max_pos = _int(f.origin, key, f.get(key, nullable=False))
    if mt in ("gpt2", "opt"):
        if mt == "opt":
            notes.append(f"OPT's learned position table has 2 extra rows (offset 2): "
                         f"{2 * h:,} parameters not counted")
        return "learned", max_pos
    if mt == "bloom" or (mt == "falcon" and f.get("alibi")):
        if mt == "bloom":
            notes.append(f"BLOOM's embedding LayerNorm ({2 * h:,} parameters) is not counted")
        return "alibi", max_pos
    return "rope", max_pos


def _dropout(f: HFFields, mt: str, notes: list[str]) -> float:
    keys = DROPOUT_KEYS.get(mt, ("attention_dropout",))
    drops = {k: _float(f.origin, k, f.get(k)) for k in keys}
    drops = {k: v for k, v in drops.items() if v is not None}
    dropout = max(drops.values(), default=0.0)
    if len(set(drops.values())) > 1:
        notes.append(f"dropout rates {drops} differ; using the largest, {dropout:g}")
    return dropout


def _shape(cfg: dict, origin: str) -> dict[str, int]:
    shape = {}
    for field, keys in SYNONYMS.items():
        key, value = _first(cfg, keys)
        if value is None:
            raise UsageError(f"{origin}: missing {' / '.join(keys)}")
        shape[field] = _int(origin, key, value)
        if shape[field] < 1:
            raise UsageError(f"{origin}: {key} must be a positive integer, got {value!r}")
    return shape


def _bool(origin: str, key: str, value) -> bool:
    """A config switch as a bool: JSON true/false (None: false, transformers' unset); a string
    such as "no" is a UsageError naming the field, not truthy."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise UsageError(f"{origin}: {key} must be true or false, got {value!r}")


def from_hf_dict(cfg: dict, origin: str, name: str) -> ModelSpec:
    """ModelSpec from a parsed config.json. UsageError naming the fields it cannot map, or a
    missing field with no checkpoint-independent default (planner.hf_fields)."""
    notes: list[str] = []
    cfg = _unwrap(cfg, origin, notes)
    mt = cfg.get("model_type")
    if mt not in CLASSES:
        raise UsageError(f"{origin}: model_type {mt!r} is not supported (supported: "
                         f"{', '.join(FAMILIES)})")
    bad = [f"{k}={cfg[k]}" for k in MOE_FIELDS if cfg.get(k)]
    if bad and mt not in hf_moe.MOE_FAMILIES:
        raise UsageError(f"{origin}: cannot map {', '.join(bad)}: model_type {mt} is dense "
                         f"(mixture-of-experts types: {', '.join(hf_moe.MOE_FAMILIES)})")
    f = HFFields(cfg, origin, mt)
    shape = _shape(cfg, origin)
    h, a, L = shape["hidden_size"], shape["num_attention_heads"], shape["num_layers"]
    kv, head_dim = _attention(f, mt, a, h, L, notes)
    activation, ffn = _mlp(f, mt, h, notes)
    if mt == "opt" and _int(origin, "word_embed_proj_dim", f.get("word_embed_proj_dim") or h) != h:
        raise UsageError(f"{origin}: cannot map word_embed_proj_dim={cfg['word_embed_proj_dim']} "
                         f"!= hidden_size {h} (OPT projection layers are not modeled)")
    position, max_pos = _positions(f, mt, h, notes)
    rope_theta = _rope_theta(cfg, origin, notes, mt) if position == "rope" else None
    rotary = _rotary_percent(f, mt) if position == "rope" else None
    if cfg.get("rope_scaling"):
        notes.append(f"rope_scaling {cfg['rope_scaling']} is not modeled by plan3d (no cost effect) "
                     "and not exported: set it in the training framework")
    data = {
        "name": name, "source": f"Hugging Face config {origin} (model_type {mt})", **shape,
        "num_kv_heads": kv if kv and kv != a else None,
        "head_dim": head_dim if head_dim and head_dim * a != h else None,
        "ffn_hidden_size": ffn, "activation": activation,
        "tie_embeddings": _bool(origin, "tie_word_embeddings", f.get("tie_word_embeddings")),
        "norm": "rmsnorm" if mt in GATED else "layernorm",
        "bias": _bias(f, mt, a, kv, head_dim or h // a, L, notes), "position_embedding": position,
        "qkv_bias": mt == "qwen2" or None, "norm_epsilon": _norm_epsilon(f, mt, notes),
        "max_position_embeddings": max_pos, "rope_theta": rope_theta, "rotary_percent": rotary,
        "dropout": _dropout(f, mt, notes),
    }
    data.update(hf_moe.architecture(f, mt, L, notes))
    seq = min(max_pos, MAX_SEQ) if max_pos else 2048
    gbs = max(1, BATCH_TOKENS // seq)
    why = f"min(max_position_embeddings, {MAX_SEQ})" if max_pos else "no position limit given"
    if f.note():
        notes.append(f.note())
    notes.append(f"training defaults chosen by plan3d (config.json has none): seq_length {seq} "
                 f"({why}), global_batch_size {gbs} (2^22 tokens / seq_length)")
    data["training"] = {"seq_length": seq, "global_batch_size": gbs}
    data["notes"] = "; ".join(notes)
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
    refuse_other_kind(cfg, str(path), "model")
    name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json" and
                                        path.parent.name else path.stem)
    return from_hf_dict(cfg, str(path), str(name))
