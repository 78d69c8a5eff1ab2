"""Fields of a Hugging Face ``config.json`` and what transformers assumes when one is missing.

A config.json usually lists every field, but a hand-written or trimmed one may not; transformers
then silently uses its configuration class's default. plan3d never does that silently
(``HFFields``): a field whose default is the size of one particular checkpoint (a width, a head
or expert count: Llama's intermediate_size 11008 is Llama-2-7B's) is REQUIRED and its absence is
a one-line error naming it; a switch or a rule (tie_word_embeddings false, num_key_value_heads =
num_attention_heads, n_inner = 4*hidden) is taken from the class and listed in the model's notes.

Defaults are those of the transformers configuration classes @ 008e57439125 (LlamaConfig,
MistralConfig, Qwen2Config, MixtralConfig, Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config,
OlmoeConfig, Llama4TextConfig, GPTNeoXConfig), GptOssConfig @ 02b8f42b4240, and the
``__init__`` defaults of GPT2Config @ 01ae98ae2414, OPTConfig @ 014674d38b61, BloomConfig
@ 04efa883e0ad and FalconConfig (v4.33 and later: max_position_embeddings 2048, rope_theta 1e4,
num_kv_heads None). tie_word_embeddings of GPT-2/OPT/BLOOM/Falcon is PretrainedConfig's True.
``moe_layer_freq`` (DeepSeek) is not a field of transformers' classes: their models make every
layer from first_k_dense_replace on MoE, i.e. 1.
"""

from __future__ import annotations

from .errors import UsageError

REQUIRED = object()   # no checkpoint-independent default: a missing field is an error

CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
           "gpt2": "GPT2Config", "gpt_neox": "GPTNeoXConfig", "opt": "OPTConfig",
           "falcon": "FalconConfig", "bloom": "BloomConfig", "mixtral": "MixtralConfig",
           "qwen3_moe": "Qwen3MoeConfig", "deepseek_v2": "DeepseekV2Config",
           "deepseek_v3": "DeepseekV3Config", "gpt_oss": "GptOssConfig", "olmoe": "OlmoeConfig",
           "llama4_text": "Llama4TextConfig"}

# rules: a default of None means "derived from other fields" as written here
RULES = {"num_key_value_heads": "num_attention_heads", "head_dim": "hidden_size / heads",
         "n_inner": "4 * hidden", "ffn_hidden_size": "4 * hidden", "num_kv_heads": "heads",
         "word_embed_proj_dim": "hidden_size", "layer_types": "alternating, sliding first",
         "moe_layers": "every interleave_moe_layer_step-th layer"}

_GATED = {"hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0}
_DEEPSEEK = {**_GATED, "intermediate_size": REQUIRED, "moe_intermediate_size": REQUIRED,
             "n_routed_experts": REQUIRED, "num_experts_per_tok": REQUIRED,
             "n_shared_experts": REQUIRED, "first_k_dense_replace": REQUIRED, "moe_layer_freq": 1,
             "q_lora_rank": REQUIRED, "kv_lora_rank": REQUIRED, "qk_nope_head_dim": REQUIRED,
             "qk_rope_head_dim": REQUIRED, "v_head_dim": REQUIRED, "attention_bias": False}

DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {**_GATED, "intermediate_size": REQUIRED, "num_key_value_heads": None,
              "head_dim": None, "attention_bias": False, "mlp_bias": False,
              "max_position_embeddings": 2048},
    "mistral": {**_GATED, "intermediate_size": REQUIRED, "num_key_value_heads": REQUIRED,
                "head_dim": None, "max_position_embeddings": 131072, "sliding_window": 4096},
    "qwen2": {**_GATED, "intermediate_size": REQUIRED, "num_key_value_heads": REQUIRED,
              "max_position_embeddings": 32768, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    "mixtral": {**_GATED, "intermediate_size": REQUIRED, "num_key_value_heads": REQUIRED,
                "head_dim": None, "max_position_embeddings": 131072, "sliding_window": None,
                "num_local_experts": REQUIRED, "num_experts_per_tok": REQUIRED},
    "qwen3_moe": {**_GATED, "intermediate_size": REQUIRED, "moe_intermediate_size": REQUIRED,
                  "num_experts": REQUIRED, "num_experts_per_tok": REQUIRED,
                  "num_key_value_heads": REQUIRED, "head_dim": None, "attention_bias": False,
                  "max_position_embeddings": 32768, "use_sliding_window": False,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v2": {**_DEEPSEEK, "max_position_embeddings": 2048},
    "deepseek_v3": {**_DEEPSEEK, "max_position_embeddings": 4096,
                    "num_nextn_predict_layers": REQUIRED},
    "gpt_oss": {**_GATED, "intermediate_size": REQUIRED, "num_local_experts": REQUIRED,
                "num_experts_per_tok": REQUIRED, "num_key_value_heads": REQUIRED,
                "head_dim": REQUIRED, "sliding_window": REQUIRED, "layer_types": None,
                "attention_bias": True, "max_position_embeddings": 131072, "swiglu_limit": 7.0},
    "olmoe": {**_GATED, "intermediate_size": REQUIRED, "num_experts": REQUIRED,
              "num_experts_per_tok": REQUIRED, "num_key_value_heads": None,
              "attention_bias": False, "max_position_embeddings": 4096},
    "llama4_text": {**_GATED, "intermediate_size": REQUIRED, "intermediate_size_mlp": REQUIRED,
                    "num_local_experts": REQUIRED, "num_experts_per_tok": REQUIRED,
                    "num_key_value_heads": REQUIRED, "head_dim": REQUIRED,
                    "interleave_moe_layer_step": 1, "moe_layers": None, "attention_bias": False,
                    "max_position_embeddings": 131072, "attention_chunk_size": 8192},
    "gpt2": {"n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1,
             "embd_pdrop": 0.1, "attn_pdrop": 0.1, "n_positions": REQUIRED,
             "tie_word_embeddings": True},
    "gpt_neox": {"intermediate_size": REQUIRED, "hidden_act": "gelu", "rotary_pct": 0.25,
                 "max_position_embeddings": 2048, "tie_word_embeddings": False,
                 "attention_bias": True, "attention_dropout": 0.0, "hidden_dropout": 0.0},
    "opt": {"ffn_dim": REQUIRED, "activation_function": "relu", "max_position_embeddings": REQUIRED,
            "dropout": 0.1, "attention_dropout": 0.0, "tie_word_embeddings": True,
            "enable_bias": True, "word_embed_proj_dim": None},
    "falcon": {"ffn_hidden_size": None, "num_kv_heads": None, "multi_query": True,
               "new_decoder_architecture": False, "parallel_attn": True, "bias": False,
               "alibi": False, "max_position_embeddings": 2048, "tie_word_embeddings": True,
               "hidden_dropout": 0.0, "attention_dropout": 0.0, "activation": "gelu"},
    "bloom": {"tie_word_embeddings": True, "hidden_dropout": 0.0, "attention_dropout": 0.0},
}

# RoPE base (rope_theta) of each family's class when the config gives none
ROPE_THETA = {"mixtral": 1e6, "gpt_oss": 150000.0, "llama4_text": 500000.0}


class HFFields:
    """Reads the fields of one parsed config.json of model_type ``family`` (a DEFAULTS key).

    ``get(key)``: the config's value (null included: an explicit null is a value), else the
    class default, recorded for the note; UsageError naming the field if it is REQUIRED (or is
    not in the family's table: a bug). ``note()``: the one sentence listing the defaults taken.
    """

    def __init__(self, cfg: dict, origin: str, family: str):
        self.cfg, self.origin, self.family = cfg, origin, family
        self.taken: list[str] = []

    def get(self, key: str, nullable: bool = True):
        if key in self.cfg and (nullable or self.cfg[key] is not None):
            return self.cfg[key]
        default = DEFAULTS[self.family][key]
        if default is REQUIRED:
            why = "is null" if key in self.cfg else "is missing"
            raise UsageError(f"{self.origin}: {key} {why} (model_type {self.family}; "
                             f"{CLASSES[self.family]} has no default that fits every checkpoint)")
        shown = f"= {RULES[key]}" if default is None and key in RULES else repr(default)
        if f"{key} {shown}" not in self.taken:
            self.taken.append(f"{key} {shown}")
        return default

    def has(self, key: str) -> bool:
        return key in self.cfg

    def note(self) -> str | None:
        """The defaults taken, as one sentence for the model's notes (None if none)."""
        if not self.taken:
            return None
        return (f"not in config.json, transformers {CLASSES[self.family]} defaults taken: "
                f"{', '.join(self.taken)}")
